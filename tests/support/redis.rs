//! Real `redis-server` processes for integration tests.
//!
//! Every [`RedisServer`] gets its own free port and its own temporary directory, so tests
//! never share state and never need `FLUSHALL`. The server's output goes to files in that
//! directory (nothing interleaves with the test output), and the process is killed when the
//! handle is dropped, or by the kernel if the test process dies first.
//!
//! The harness is synchronous on purpose: it only spawns processes and speaks a few bytes
//! of RESP by hand, so it works from plain `#[test]`s and from async tests alike.
//!
//! Needs `redis-server` and `redis-cli` (7.0 or later) on `PATH`;
//! [`RedisServerBuilder::clock_skew_secs`] also needs a C compiler (`cc`).
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server gets to answer `PING` (and finish loading its AOF) after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::stop`] waits for a graceful exit before giving up.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] keeps retrying its old port while the previous socket lingers.
const RESTART_PORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a freshly created cluster gets to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// A fresh start picks a new free port this many times before giving up: another process
/// can grab the port between our probe and Redis's own bind.
const PORT_ATTEMPTS: usize = 5;

const LOG_FILE: &str = "redis.log";
const STDOUT_FILE: &str = "stdout.log";
const STDERR_FILE: &str = "stderr.log";

/// A real redis-server for one test: own free port, own temp dir, killed on drop.
///
/// The server runs in the foreground as a child of the test process. On Linux it also gets
/// `PR_SET_PDEATHSIG(SIGKILL)`, so it cannot outlive the test process even if the test
/// binary is killed. Note that Linux ties that signal to the *thread* that spawned the
/// child: a server started (or restarted) on a short-lived helper thread dies with that
/// thread, so start servers on the test's own thread.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// Cluster bus port, chosen explicitly (`--cluster-port`) because the default
    /// `port + 10000` is often above 65535 for ports from the ephemeral range.
    cluster_port: Option<u16>,
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
    cluster_enabled: bool,
    extra_args: Vec<String>,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        RedisServerBuilder {
            appendonly: true,
            appendfsync: "always".to_owned(),
            clock_skew: None,
            cluster_enabled: false,
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

    /// Runs the server as a cluster node (`--cluster-enabled yes`, `nodes.conf` in its dir,
    /// a 2 s node timeout so failure detection is quick). Usually used via [`RedisCluster`].
    pub fn cluster_enabled(mut self, on: bool) -> Self {
        self.cluster_enabled = on;
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
        let cluster_enabled = self.cluster_enabled;
        let mut server = RedisServer {
            child: None,
            port: 0,
            cluster_port: None,
            config: self,
            dir,
        };
        let mut reasons = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            if cluster_enabled {
                server.cluster_port = Some(free_port());
            }
            match server.launch() {
                Ok(()) => return server,
                Err(Failure::AddressInUse(reason)) => {
                    server.kill();
                    reasons.push(reason);
                }
                Err(Failure::Other(reason)) => server.fail(&reason),
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
    /// log files live here. Removed when the server is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The contents of the server's log file, across all its restarts.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.path().join(LOG_FILE))
    }

    /// The pid of the running `redis-server` process, if one was started and not yet
    /// killed or stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL and waits for it to exit: a crash, with no chance to
    /// flush anything. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors only mean it has already exited, which is what we want anyway.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server gracefully with SIGTERM (it finishes its AOF writes and exits) and
    /// waits for it to exit. Does nothing if it is not running. Panics, with the log, if it
    /// is still running after 10 s (it is then killed).
    pub fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits in pid_t");
        // SAFETY: plain kill(2) on our own, not yet reaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut backoff = Backoff::new();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => backoff.sleep(),
                Ok(None) => {
                    self.kill();
                    self.fail(&format!(
                        "did not exit within {STOP_TIMEOUT:?} of SIGTERM, so it was killed"
                    ));
                }
                Err(err) => panic!("cannot wait for redis-server (pid {pid}): {err}"),
            }
        }
        self.child = None;
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
                Err(Failure::AddressInUse(_)) if Instant::now() < deadline => {
                    self.kill();
                    backoff.sleep();
                }
                Err(Failure::AddressInUse(reason) | Failure::Other(reason)) => {
                    self.fail(&format!("restart failed: {reason}"))
                }
            }
        }
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` and returns its trimmed stdout.
    ///
    /// `args` may start with redis-cli options (e.g. `-c` to follow cluster redirects).
    /// An error *reply* is not a failure for redis-cli: it comes back as text such as
    /// `ERR unknown command ...`, so tests can assert on it. Panics, with stderr, if
    /// redis-cli itself fails (e.g. cannot connect).
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run redis-cli: is it installed and on PATH?");
        if !output.status.success() {
            panic!(
                "redis-cli -p {} {:?} failed ({}):\n--- stderr ---\n{}\n--- stdout ---\n{}",
                self.port,
                args,
                output.status,
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout),
            );
        }
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Whether the server process is alive (started, not killed or stopped, not crashed).
    pub fn is_running(&self) -> bool {
        let Some(child) = self.child.as_ref() else {
            return false;
        };
        let pid = libc::id_t::from(child.id());
        // WNOWAIT peeks at the child's state without reaping it, so `Child::wait` still
        // works later and this can take `&self`.
        // SAFETY: siginfo_t is plain data; zeroed is its documented "no child changed" state.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(2) on our own child with a valid out-pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // rc == -1 (ECHILD) means it was already reaped; si_pid != 0 means it has exited.
        // SAFETY: waitid filled `info` (or left it zeroed).
        rc == 0 && unsafe { info.si_pid() } == 0
    }

    /// Spawns redis-server on `self.port` and waits until it is ready. On failure the
    /// child is left in `self.child` for the caller to kill (or for `Drop`).
    fn launch(&mut self) -> Result<(), Failure> {
        let dir = self.dir.path().to_owned();
        // Only output written by this attempt decides whether it hit a taken port.
        let marks = OutputMarks::take(&dir);
        let mut cmd = Command::new("redis-server");
        cmd.args(self.args())
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(append_file(&dir.join(STDOUT_FILE)))
            .stderr(append_file(&dir.join(STDERR_FILE)));
        if let Some(secs) = &self.config.clock_skew {
            cmd.env("LD_PRELOAD", clock_skew_shim())
                .env("SKEW_SECS", secs);
        }
        set_parent_death_signal(&mut cmd);
        let child = cmd.spawn().map_err(|err| {
            Failure::Other(format!("cannot spawn redis-server (is it on PATH?): {err}"))
        })?;
        self.child = Some(child);
        self.wait_ready(Instant::now() + READY_TIMEOUT)
            .map_err(|reason| marks.classify(&dir, reason))
    }

    fn args(&self) -> Vec<String> {
        let dir = self.dir.path();
        let c = &self.config;
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.to_string_lossy(),
            "--logfile",
            &dir.join(LOG_FILE).to_string_lossy(),
            "--save",
            "",
            "--appendonly",
            if c.appendonly { "yes" } else { "no" },
            "--appendfsync",
            &c.appendfsync,
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if c.cluster_enabled {
            let bus = self.cluster_port.expect("cluster node has a bus port");
            for arg in [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus.to_string(),
            ] {
                args.push(arg.to_owned());
            }
        }
        args.extend(c.extra_args.iter().cloned());
        args
    }

    /// Polls until the server answers `PING` with `+PONG`, reports `loading:0` and turns out
    /// to be *our* process (not another test's server that owns the port), or until
    /// `deadline`. Returns why it is not ready on failure.
    fn wait_ready(&mut self, deadline: Instant) -> Result<(), String> {
        let child = self.child.as_mut().expect("wait_ready after spawn");
        let pid = child.id();
        let mut backoff = Backoff::new();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Err(format!("redis-server exited early ({status})")),
                Ok(None) => {}
                Err(err) => return Err(format!("cannot wait for redis-server: {err}")),
            }
            let last = match probe(self.port) {
                Ok(Probe::Ready { pid: server_pid }) if server_pid == pid => return Ok(()),
                Ok(Probe::Ready { pid: server_pid }) => format!(
                    "port {} is answered by another redis-server (pid {server_pid}, ours is {pid})",
                    self.port
                ),
                Ok(Probe::NotYet(why)) => why,
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "not ready within {READY_TIMEOUT:?} (last probe: {last})"
                ));
            }
            backoff.sleep();
        }
    }

    /// Waits (until `deadline`) until our ports can be bound again, since the previous
    /// process's sockets may linger for a moment after it exits.
    fn wait_ports_free(&self, deadline: Instant) {
        let mut backoff = Backoff::new();
        for port in std::iter::once(self.port).chain(self.cluster_port) {
            // std's TcpListener sets SO_REUSEADDR, like redis-server, so TIME_WAIT
            // connections do not count as "in use" here either.
            while TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
                if Instant::now() >= deadline {
                    // Let the launch attempt report the real error with the log.
                    return;
                }
                backoff.sleep();
            }
        }
    }

    /// Panics with everything the server wrote, after killing it.
    fn fail(&mut self, reason: &str) -> ! {
        self.kill();
        let dir = self.dir.path();
        panic!(
            "redis-server on 127.0.0.1:{} (dir {}) failed: {reason}\n\
             --- {LOG_FILE} ---\n{}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            self.port,
            dir.display(),
            self.log(),
            read_lossy(&dir.join(STDERR_FILE)),
            read_lossy(&dir.join(STDOUT_FILE)),
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real local Redis Cluster of N masters (N >= 3), joined with
/// `redis-cli --cluster create 127.0.0.1:p1 ... --cluster-yes`, ready once every node's log
/// says "Cluster state changed: ok". Nodes killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` cluster-enabled servers (no replicas), assigns all 16384 slots with
    /// `redis-cli --cluster create`, and waits (up to 30 s) until every node has logged
    /// "Cluster state changed: ok" and reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "Redis Cluster needs at least 3 masters, got {masters}"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::builder().cluster_enabled(true).start())
            .collect();
        let cluster = RedisCluster { nodes };

        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run redis-cli: is it installed and on PATH?");
        if !output.status.success() {
            cluster.fail(&format!(
                "redis-cli --cluster create failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            ));
        }

        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let mut backoff = Backoff::new();
        while !cluster.nodes.iter().all(|node| {
            node.log().contains("Cluster state changed: ok")
                && node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
        }) {
            if Instant::now() >= deadline {
                cluster.fail(&format!(
                    "not every node reached cluster_state:ok within {CLUSTER_TIMEOUT:?}"
                ));
            }
            backoff.sleep();
        }
        cluster
    }

    /// The `redis://127.0.0.1:PORT` URL of every node, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Panics with each node's `CLUSTER INFO` and log (the nodes are killed by `Drop`).
    fn fail(&self, reason: &str) -> ! {
        let mut report = format!("Redis Cluster failed: {reason}");
        for node in &self.nodes {
            let info = if node.is_running() {
                node.cli(&["CLUSTER", "INFO"])
            } else {
                "(not running)".to_owned()
            };
            report.push_str(&format!(
                "\n=== node 127.0.0.1:{} ===\n--- CLUSTER INFO ---\n{info}\n--- {LOG_FILE} ---\n{}",
                node.port(),
                node.log()
            ));
        }
        panic!("{report}");
    }
}

/// Why a launch failed: a taken port is worth retrying, anything else is not.
enum Failure {
    AddressInUse(String),
    Other(String),
}

/// Sizes of the output files before a launch, so that only what this attempt wrote is
/// searched for "Address already in use" (the files are appended to across restarts).
struct OutputMarks {
    log: u64,
    stderr: u64,
}

impl OutputMarks {
    fn take(dir: &Path) -> Self {
        let len = |name| fs::metadata(dir.join(name)).map_or(0, |m| m.len());
        OutputMarks {
            log: len(LOG_FILE),
            stderr: len(STDERR_FILE),
        }
    }

    fn classify(&self, dir: &Path, reason: String) -> Failure {
        let new_log = read_from(&dir.join(LOG_FILE), self.log);
        let new_stderr = read_from(&dir.join(STDERR_FILE), self.stderr);
        if new_log.contains("Address already in use")
            || new_stderr.contains("Address already in use")
        {
            Failure::AddressInUse(reason)
        } else {
            Failure::Other(reason)
        }
    }
}

enum Probe {
    Ready { pid: u32 },
    NotYet(String),
}

/// One readiness check: `PING` must answer `+PONG` (not `-LOADING`), then `INFO` must show
/// `loading:0`; returns the answering server's `process_id` so the caller can tell whether
/// it is talking to its own child.
fn probe(port: u16) -> io::Result<Probe> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut conn = BufReader::new(stream);

    match command(&mut conn, &["PING"])? {
        Reply::Simple(s) if s == "PONG" => {}
        other => return Ok(Probe::NotYet(format!("PING answered {other:?}"))),
    }
    let info = match command(&mut conn, &["INFO", "server", "persistence"])? {
        Reply::Bulk(info) => info,
        other => return Ok(Probe::NotYet(format!("INFO answered {other:?}"))),
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    if field("loading") != Some("0") {
        return Ok(Probe::NotYet("still loading its data".to_owned()));
    }
    match field("process_id").and_then(|pid| pid.parse().ok()) {
        Some(pid) => Ok(Probe::Ready { pid }),
        None => Ok(Probe::NotYet("INFO has no process_id".to_owned())),
    }
}

/// The few RESP reply kinds the readiness probe needs to tell apart.
#[derive(Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Bulk(String),
    Other(String),
}

/// Sends one command as a RESP array and reads one reply.
fn command(conn: &mut BufReader<TcpStream>, args: &[&str]) -> io::Result<Reply> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    conn.get_mut().write_all(request.as_bytes())?;

    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(line.len().min(1));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        "$" => {
            let len: usize = rest.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad bulk length {rest:?}"),
                )
            })?;
            let mut body = vec![0; len + 2]; // payload + CRLF
            conn.read_exact(&mut body)?;
            body.truncate(len);
            Reply::Bulk(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Reply::Other(line.to_owned()),
    })
}

/// A port that was free a moment ago: bind port 0, read what the kernel chose, release it.
/// Another process may take it before redis-server binds it; `start` retries for that.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("cannot bind 127.0.0.1:0 to find a free port")
        .port()
}

/// Compiles `clock_skew.c` once per test binary and returns the shared object's path.
fn clock_skew_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/clock_skew.c");
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

/// Makes the kernel SIGKILL the server when the test process (strictly: the spawning
/// thread) dies, so a crashed or killed test run leaves no redis-server behind.
#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

fn append_file(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|err| panic!("cannot open {}: {err}", path.display()))
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|err| format!("(cannot read {}: {err})", path.display()))
}

fn read_from(path: &Path, offset: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
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
