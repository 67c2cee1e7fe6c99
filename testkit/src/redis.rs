//! Real `redis-server` processes, started with the service's launcher
//! (`batcher::embedded::launcher`).
//!
//! Every [`RedisServer`] gets its own free port and its own temporary directory, so tests
//! never share state and never need `FLUSHALL`. The server's output goes to a log file in
//! that directory (nothing interleaves with the test output), and the process is killed when
//! the handle is dropped, or by the kernel if the test process dies first.
//!
//! The harness is synchronous on purpose, so it works from plain `#[test]`s and from async
//! tests alike.
//!
//! Needs `redis-server` and `redis-cli` (7.0 or later) on `PATH`;
//! [`RedisServerBuilder::clock_skew_secs`] also needs a C compiler (`cc`).

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use batcher::embedded::launcher::{self, Launch, LaunchError, Listen};
use tempfile::TempDir;

use crate::wait::Wait;

/// How long a server gets to answer `PING` (and finish loading its AOF) after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::stop`] waits for a graceful exit before giving up.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] keeps retrying its old port while the previous socket lingers.
const RESTART_PORT_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Its port, the same across restarts (0 until the first start).
    port: u16,
    /// How it runs.
    config: RedisServerBuilder,
    // Declared last so it is removed only after `Drop` has killed the process.
    dir: TempDir,
}

/// Options for a [`RedisServer`]; get one from [`RedisServer::builder`].
#[derive(Clone, Debug)]
pub struct RedisServerBuilder {
    /// `--appendonly`.
    appendonly: bool,
    /// `--appendfsync`.
    appendfsync: String,
    /// Seconds the server's wall clock is moved by, if any.
    clock_skew: Option<String>,
    /// Raw arguments after all the others.
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

    /// Starts the server on a free port and returns once it answers `PING` and has
    /// finished loading. Panics, with the server's whole log, if it does not come up.
    pub fn start(self) -> RedisServer {
        let mut server = self.stopped().unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = server.launch(Listen::FreePort) {
            server.fail(&e.to_string());
        }
        server
    }

    /// [`RedisServerBuilder::start`] for a caller that reports errors
    /// itself (the bench): the error carries the tail of the server's log.
    pub fn try_start(self) -> Result<RedisServer, LaunchError> {
        let mut server = self.stopped()?;
        server.launch(Listen::FreePort)?;
        Ok(server)
    }

    /// The server, not started yet, with its directory.
    fn stopped(self) -> Result<RedisServer, LaunchError> {
        if self.clock_skew.is_some() {
            // Fail before spawning anything, with a message that says what is missing.
            clock_skew_shim();
        }
        let dir = tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir()
            .map_err(|e| LaunchError::Io("creating a temporary directory".into(), e))?;
        Ok(RedisServer {
            server: None,
            port: 0,
            config: self,
            dir,
        })
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
        let port = self.port;
        let wait = Wait::new(
            format!("port {port} to take a server"),
            RESTART_PORT_TIMEOUT,
        );
        let restarted = wait.until_blocking(|| {
            // std's TcpListener sets SO_REUSEADDR, like redis-server, so
            // TIME_WAIT connections do not count as "in use" here either.
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
                return Err("the previous socket still holds it".to_owned());
            }
            match self.launch(Listen::Port(port)) {
                Err(e @ LaunchError::AddressInUse { .. }) => Err(e.to_string()),
                done => Ok(done),
            }
        });
        match restarted {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(&format!("restart failed: {e}")),
            Err(e) => self.fail(&format!("restart failed: {e}")),
        }
    }

    /// [`cli`] on this server.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// How many keys hold data: every key but the data format marker and
    /// the shard count beside it, which a service sets when it starts.
    pub fn data_keys(&self) -> String {
        let script = "local n = 0 for _, k in ipairs(redis.call('KEYS', '*')) do \
                      if not (string.find(k, '}:format$') or string.find(k, '}:shards$')) \
                      then n = n + 1 end end return n";
        self.cli(&["EVAL", script, "0"])
    }

    /// Whether the server process is alive (started, not killed or stopped, not crashed).
    pub fn is_running(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(launcher::RedisServer::is_running)
    }

    /// Starts redis-server at `listen` with the launcher (which retries
    /// another free port when a free one turns out taken) and waits until
    /// it is ready; its port is this server's from then on.
    fn launch(&mut self, listen: Listen) -> Result<(), LaunchError> {
        let server = self.launch_config(listen).start()?;
        self.port = server.port().expect("a TCP port");
        self.server = Some(server);
        Ok(())
    }

    /// How the launcher runs this server.
    fn launch_config(&self, listen: Listen) -> Launch {
        let c = &self.config;
        let mut launch = Launch::new()
            .dir(self.dir.path())
            .listen(listen)
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

/// Compiles `clock_skew.c` once per process and returns the shared object's path.
fn clock_skew_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let stem = format!("batcher-clock-skew-{}", std::process::id());
        let source = std::env::temp_dir().join(format!("{stem}.c"));
        std::fs::write(&source, include_str!("clock_skew.c"))
            .unwrap_or_else(|e| panic!("writing {}: {e}", source.display()));
        let out = std::env::temp_dir().join(format!("{stem}.so"));
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
