//! Real `redis-server` processes for integration tests, started with the
//! library's launcher (`batcher::embedded::launcher`).
//!
//! Every [`RedisServer`] gets its own free port and its own temporary directory, so tests
//! never share state and never need `FLUSHALL`. The server's output goes to a log file in
//! that directory (nothing interleaves with the test output), and the process is killed when
//! the handle is dropped, or by the kernel if the test process dies first.
//!
//! The harness is synchronous on purpose, so it works from plain `#[test]`s and from async
//! tests alike.
//!
//! A Redis Cluster is the library's `launcher::Cluster`, see `support::cluster`.
//!
//! Needs `redis-server` and `redis-cli` (7.0 or later) on `PATH`;
//! [`RedisServerBuilder::clock_skew_secs`] also needs a C compiler (`cc`).
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use batcher::embedded::launcher::{self, Launch, LaunchError, Listen};
use tempfile::TempDir;

/// How long a server gets to answer `PING` (and finish loading its AOF) after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::stop`] waits for a graceful exit before giving up.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] keeps retrying its old port while the previous socket lingers.
const RESTART_PORT_TIMEOUT: Duration = Duration::from_secs(5);
/// A fresh start picks new free ports this many times before giving up: another process
/// can grab a port between our probe and Redis's own bind.
const PORT_ATTEMPTS: usize = 5;

/// A real redis-server for one test: own free port, own temp dir, killed on drop.
///
/// The server runs in the foreground as a child of the test process. On Linux it also gets
/// `PR_SET_PDEATHSIG(SIGKILL)`, so it cannot outlive the test process even if the test
/// binary is killed. Note that Linux ties that signal to the *thread* that spawned the
/// child: a server started (or restarted) on a short-lived helper thread dies with that
/// thread, so start servers on the test's own thread.
pub struct RedisServer {
    /// The running child, if any; `None` after `kill`/`stop` until `restart`.
    server: Option<launcher::RedisServer>,
    port: u16,
    config: RedisServerBuilder,
    // Declared last so it is removed only after `Drop` has killed the process.
    dir: TempDir,
}
/// Options for a [`RedisServer`]; get one from [`RedisServer::builder`].
#[derive(Clone, Debug)]
pub struct RedisServerBuilder {
    appendonly: bool,
    appendfsync: String,
    clock_skew: Option<String>,
    extra_args: Vec<String>,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        RedisServerBuilder {
            appendonly: true,
            appendfsync: "always".to_owned(),
            clock_skew: None,
            extra_args: Vec::new(),
        }
    }
}

impl RedisServerBuilder {
    /// Whether to persist with an append-only file. Default `true`, so that
    /// [`RedisServer::restart`] keeps the data written before it.
    pub fn appendonly(mut self, on: bool) -> Self {
        self.appendonly = on;
        self
    }

    /// The AOF fsync policy (`always`, `everysec` or `no`). Default `always`, so that even a
    /// [`RedisServer::kill`] (a crash) loses no acknowledged write.
    pub fn appendfsync(mut self, policy: &str) -> Self {
        self.appendfsync = policy.to_owned();
        self
    }

    /// Puts the server's wall clock `secs` seconds away from the host's, to
    /// test code that must follow Redis's clock. It preloads a tiny shim
    /// (`clock_skew.c`, compiled with the machine's C compiler on first use)
    /// that shifts the real-time clocks; libfaketime cannot be used because it
    /// deadlocks with the jemalloc that Debian's redis-server links.
    pub fn clock_skew_secs(mut self, secs: i64) -> Self {
        self.clock_skew = Some(secs.to_string());
        self
    }

    /// Appends a raw command-line argument for `redis-server`, after all the others.
    /// For the harness's own tests (e.g. to make a start fail on purpose).
    #[doc(hidden)]
    pub fn extra_arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_owned());
        self
    }

    /// Starts the server on a fresh free port and returns once it answers `PING` and has
    /// finished loading. Panics, with the server's whole log, if it does not come up.
    pub fn start(self) -> RedisServer {
        if self.clock_skew.is_some() {
            // Fail before spawning anything, with a message that says what is missing.
            clock_skew_shim();
        }
        let dir = tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir()
            .expect("cannot create a temporary directory for redis-server");
        let mut server = RedisServer {
            server: None,
            port: 0,
            config: self,
            dir,
        };
        let mut reasons = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            match server.launch() {
                Ok(()) => return server,
                Err(e @ LaunchError::AddressInUse { .. }) => reasons.push(e.to_string()),
                Err(e) => server.fail(&e.to_string()),
            }
        }
        server.fail(&format!(
            "every one of {PORT_ATTEMPTS} free ports was taken before redis-server could bind it: {}",
            reasons.join("; ")
        ))
    }
}

impl RedisServer {
    /// Starts a server with the default options: AOF on, `appendfsync always`.
    pub fn start() -> RedisServer {
        Self::builder().start()
    }

    /// Options for a server; finish with [`RedisServerBuilder::start`].
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port the server listens on (on 127.0.0.1). Stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, for a Redis client or the service's config.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's working directory: the AOF (`appendonlydir/`), `nodes.conf` and the
    /// log file live here. Removed when the server is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The contents of the server's log file (its log, stdout and stderr), across all its
    /// restarts.
    pub fn log(&self) -> String {
        let path = self.dir.path().join(launcher::LOG_NAME);
        std::fs::read(&path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_else(|err| format!("(cannot read {}: {err})", path.display()))
    }

    /// The pid of the running `redis-server` process, if one was started and not yet
    /// killed or stopped.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(launcher::RedisServer::pid)
    }

    /// Kills the server with SIGKILL and waits for it to exit: a crash, with no chance to
    /// flush anything. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
    }

    /// Stops the server gracefully with SIGTERM (it finishes its AOF writes and exits) and
    /// waits for it to exit. Does nothing if it is not running. Panics, with the log, if it
    /// is still running after 10 s (it is then killed).
    pub fn stop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        if !server.terminate(STOP_TIMEOUT) {
            self.fail(&format!(
                "did not exit within {STOP_TIMEOUT:?} of SIGTERM, so it was killed"
            ));
        }
    }

    /// Starts the server again on the same port and in the same directory, so it reloads
    /// its AOF, and waits until it is ready. A server that is still running is first
    /// stopped gracefully. Retries for a few seconds while the old socket lingers.
    pub fn restart(&mut self) {
        if self.is_running() {
            self.stop();
        }
        self.kill(); // reap a server that died on its own
        let deadline = Instant::now() + RESTART_PORT_TIMEOUT;
        let mut backoff = Backoff::new();
        loop {
            self.wait_ports_free(deadline);
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::AddressInUse { .. }) if Instant::now() < deadline => {
                    backoff.sleep();
                }
                Err(e) => self.fail(&format!("restart failed: {e}")),
            }
        }
    }

    /// [`cli`] on this server.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// How many keys hold data: every key but the data format marker, which
    /// a service sets when it starts.
    pub fn data_keys(&self) -> String {
        let script = "local n = 0 for _, k in ipairs(redis.call('KEYS', '*')) do \
                      if not string.find(k, '}:format$') then n = n + 1 end end return n";
        self.cli(&["EVAL", script, "0"])
    }

    /// Whether the server process is alive (started, not killed or stopped, not crashed).
    pub fn is_running(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(launcher::RedisServer::is_running)
    }

    /// Starts redis-server on `self.port` with the launcher and waits until it is ready.
    fn launch(&mut self) -> Result<(), LaunchError> {
        self.server = Some(self.launch_config().start()?);
        Ok(())
    }

    /// How the launcher runs this server.
    fn launch_config(&self) -> Launch {
        let c = &self.config;
        let mut launch = Launch::new()
            .dir(self.dir.path())
            .listen(Listen::Port(self.port))
            .ready_timeout(READY_TIMEOUT)
            .config("appendonly", if c.appendonly { "yes" } else { "no" })
            .config("appendfsync", &c.appendfsync)
            .config("protected-mode", "no");
        if let Some(secs) = &c.clock_skew {
            launch = launch
                .env("LD_PRELOAD", clock_skew_shim())
                .env("SKEW_SECS", secs);
        }
        c.extra_args
            .iter()
            .fold(launch, |launch, arg| launch.arg(arg))
    }

    /// Waits (until `deadline`) until our port can be bound again, since the previous
    /// process's socket may linger for a moment after it exits.
    fn wait_ports_free(&self, deadline: Instant) {
        let mut backoff = Backoff::new();
        // std's TcpListener sets SO_REUSEADDR, like redis-server, so TIME_WAIT
        // connections do not count as "in use" here either.
        while TcpListener::bind((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            if Instant::now() >= deadline {
                // Let the launch attempt report the real error with the log.
                return;
            }
            backoff.sleep();
        }
    }

    /// Panics with everything the server wrote, after killing it.
    fn fail(&mut self, reason: &str) -> ! {
        self.kill();
        panic!(
            "redis-server on 127.0.0.1:{} (dir {}) failed: {reason}\n--- {} ---\n{}",
            self.port,
            self.dir.path().display(),
            launcher::LOG_NAME,
            self.log(),
        );
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` and returns its trimmed stdout.
///
/// `args` may start with redis-cli options (e.g. `-c` to follow cluster redirects).
/// An error *reply* is not a failure for redis-cli: it comes back as text such as
/// `ERR unknown command ...`, so tests can assert on it. Panics, with stderr, if
/// redis-cli itself fails (e.g. cannot connect).
pub fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run redis-cli: is it installed and on PATH?");
    if !output.status.success() {
        panic!(
            "redis-cli -p {port} {args:?} failed ({}):\n--- stderr ---\n{}\n--- stdout ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout),
        );
    }
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A port that was free a moment ago; another process may take it before redis-server
/// binds it, and `start` retries for that.
fn free_port() -> u16 {
    launcher::free_port().expect("cannot bind 127.0.0.1:0 to find a free port")
}

/// Compiles `clock_skew.c` once per test binary and returns the shared object's path.
fn clock_skew_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/support/clock_skew.c");
        let out =
            std::env::temp_dir().join(format!("batcher-clock-skew-{}.so", std::process::id()));
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("clock skew needs a C compiler (cc): {e}"));
        assert!(status.success(), "compiling {} failed", source.display());
        out
    })
    .clone()
}

/// Short exponential backoff for polling loops: 5 ms doubling up to 100 ms.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Backoff(Duration::from_millis(5))
    }

    fn sleep(&mut self) {
        thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_millis(100));
    }
}
