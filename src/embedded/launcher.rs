//! The one way this project starts a `redis-server` child: embedded mode, the
//! bench and the test harness all use it.
//!
//! A [`Launch`] says how to run the server: which binary, in which dir (or a
//! temporary dir of its own), listening on a free loopback port, a given port
//! or a unix socket, with which extra `--flag value` arguments and environment
//! variables. [`Launch::start`] (blocking) and [`Launch::start_async`] spawn
//! the child and return once it answers `PING` through redis-rs and turns out
//! to be *our* child (its `INFO server` `process_id`), so another server on a
//! taken port is never mistaken for ours; a start on a free port that loses
//! the race for it retries on another. A start that fails returns a
//! [`LaunchError`] carrying the tail of the server's log.
//!
//! The child gets a parent-death signal (Linux `PR_SET_PDEATHSIG`, SIGKILL
//! unless told otherwise), so it never outlives the process that spawned it.
//! Linux ties that signal to the *thread* that spawned the child: spawn from a
//! thread that lives as long as the server should. Dropping a [`RedisServer`]
//! sends it the same signal. Its stdout, stderr and log all go to
//! `<dir>/redis.log`.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a fresh server may take to answer `PING` (loading its AOF
/// included), unless [`Launch::ready_timeout`] says otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Name of the log file (redis's own log, stdout and stderr) inside the dir.
pub const LOG_NAME: &str = "redis.log";
/// How many log lines a [`LaunchError`] carries.
pub const LOG_TAIL_LINES: usize = 20;
/// Bound on one connect-and-command probe of a local server.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How many free ports a start tries before giving up: another process can
/// take the port between our probe and redis's own bind.
const PORT_ATTEMPTS: usize = 5;
/// What redis logs when its port or socket is taken.
const ADDRESS_IN_USE: &str = "Address already in use";

/// A loopback TCP port that was free a moment ago (bind port 0, read what the
/// kernel chose, release it). Another process may take it before we use it.
pub fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Makes `cmd`'s child receive `signal` when the spawning thread exits, and
/// fail to start if the parent is already gone by then. Does nothing outside
/// Linux.
pub fn set_parent_death_signal(cmd: &mut Command, signal: libc::c_int) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid is async-signal-safe.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs between fork and exec, only calls
        // async-signal-safe functions and builds io::Errors from raw codes,
        // which does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = signal;
    cmd
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A loopback TCP port from [`free_port`], picked anew at each start; a
    /// start that finds it taken retries with another.
    FreePort,
    /// This loopback TCP port.
    Port(u16),
    /// Only this unix socket (mode 700), no TCP at all.
    Unix(PathBuf),
}

/// How to run one `redis-server`; see the module docs.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The binary: a path, or a bare name looked up in `PATH`.
    binary: PathBuf,
    /// `--dir`; `None` makes a temporary dir per start, removed with the server.
    dir: Option<PathBuf>,
    /// Where it listens.
    listen: Listen,
    /// Arguments after our own, so they can override ours.
    args: Vec<OsString>,
    /// Extra environment variables (e.g. `LD_PRELOAD` for a test shim).
    envs: Vec<(OsString, OsString)>,
    /// Sent on parent death and on drop.
    death_signal: libc::c_int,
    /// Whether the child gets its own process group, so a terminal's Ctrl-C
    /// reaches only the parent.
    own_process_group: bool,
    /// How long a start waits for the first PONG.
    ready_timeout: Duration,
}

impl Default for Launch {
    fn default() -> Self {
        Launch::new()
    }
}

impl Launch {
    /// `redis-server` from `PATH`, in a temporary dir of its own, on a free
    /// loopback port, with no RDB snapshots (`--save ""`), SIGKILLed when its
    /// parent dies or its handle is dropped.
    pub fn new() -> Launch {
        Launch {
            binary: PathBuf::from("redis-server"),
            dir: None,
            listen: Listen::FreePort,
            args: vec!["--save".into(), "".into()],
            envs: Vec::new(),
            death_signal: libc::SIGKILL,
            own_process_group: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }

    /// The binary to run: a path, or a bare name looked up in `PATH`.
    pub fn binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Runs in `dir` (created if missing; kept after the server is gone),
    /// so a later start in the same dir reloads its data.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Where the server listens; [`Listen::FreePort`] by default.
    pub fn listen(mut self, listen: Listen) -> Self {
        self.listen = listen;
        self
    }

    /// Adds `--name value` (e.g. `config("appendonly", "yes")`), after the
    /// launcher's own arguments so it overrides them.
    pub fn config(mut self, name: &str, value: impl AsRef<OsStr>) -> Self {
        self.args.push(format!("--{name}").into());
        self.args.push(value.as_ref().to_owned());
        self
    }

    /// Adds one raw command-line argument, after all the others.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Sets an environment variable for the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The signal sent on parent death and on drop (SIGKILL by default;
    /// SIGTERM lets redis fsync its AOF first).
    pub fn death_signal(mut self, signal: libc::c_int) -> Self {
        self.death_signal = signal;
        self
    }

    /// Runs the child in its own process group, so a terminal's Ctrl-C does
    /// not kill it under a parent that is still shutting down.
    pub fn own_process_group(mut self) -> Self {
        self.own_process_group = true;
        self
    }

    /// How long a start waits for the server to answer.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the server and blocks until it is ready; see the module docs.
    pub fn start(&self) -> Result<RedisServer, LaunchError> {
        let mut tries = self.attempts();
        loop {
            let mut server = self.spawn()?;
            match server.wait_ready() {
                Err(e) if retry(&e, &mut tries) => continue,
                done => return done.map(|()| server),
            }
        }
    }

    /// [`Launch::start`] for async callers: the same, without blocking a
    /// runtime thread. The child is spawned from the calling thread.
    pub async fn start_async(&self) -> Result<RedisServer, LaunchError> {
        let mut tries = self.attempts();
        loop {
            let mut server = self.spawn()?;
            match server.wait_ready_async().await {
                Err(e) if retry(&e, &mut tries) => continue,
                done => return done.map(|()| server),
            }
        }
    }

    /// Spawns the child and returns at once, before it is ready; follow with
    /// [`RedisServer::wait_ready`] or [`RedisServer::wait_ready_async`].
    pub fn spawn(&self) -> Result<RedisServer, LaunchError> {
        let (dir, temp) = match &self.dir {
            Some(dir) => {
                fs::create_dir_all(dir)
                    .map_err(|e| LaunchError::Io(format!("creating {}", dir.display()), e))?;
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("redis-")
                    .tempdir()
                    .map_err(|e| LaunchError::Io("creating a temporary dir".into(), e))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let listen = match &self.listen {
            Listen::FreePort => Listen::Port(
                free_port().map_err(|e| LaunchError::Io("picking a free port".into(), e))?,
            ),
            other => other.clone(),
        };
        let log = dir.join(LOG_NAME);
        let log_start = fs::metadata(&log).map_or(0, |m| m.len());
        let child = self.command(&dir, &log, &listen)?.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                LaunchError::NotInstalled {
                    binary: self.binary.clone(),
                }
            } else {
                LaunchError::Io(format!("spawning {}", self.binary.display()), e)
            }
        })?;
        Ok(RedisServer {
            pid: child.id(),
            child: Some(child),
            url: url(&listen),
            listen,
            dir,
            log,
            log_start,
            death_signal: self.death_signal,
            ready_timeout: self.ready_timeout,
            _temp: temp,
        })
    }

    /// How many spawns a start may take.
    fn attempts(&self) -> usize {
        match self.listen {
            Listen::FreePort => PORT_ATTEMPTS,
            _ => 1,
        }
    }

    /// The command line, stdio and pre-exec setup for one child.
    fn command(&self, dir: &Path, log: &Path, listen: &Listen) -> Result<Command, LaunchError> {
        let open_err = |e| LaunchError::Io(format!("opening {}", log.display()), e);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(open_err)?;
        let err = out.try_clone().map_err(open_err)?;
        let mut cmd = Command::new(&self.binary);
        match listen {
            Listen::Unix(path) => {
                cmd.args(["--port", "0", "--unixsocket"]).arg(path);
                cmd.args(["--unixsocketperm", "700"]);
            }
            Listen::Port(port) => {
                cmd.arg("--port").arg(port.to_string());
                cmd.args(["--bind", "127.0.0.1"]);
            }
            Listen::FreePort => unreachable!("resolved to a port by spawn"),
        }
        cmd.arg("--dir").arg(dir).arg("--logfile").arg(log);
        cmd.args(["--daemonize", "no"]).args(&self.args);
        cmd.envs(self.envs.iter().map(|(k, v)| (k, v)));
        // Anything redis prints before its log is open (config errors) lands
        // in the same log, so errors carry it.
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        if self.own_process_group {
            cmd.process_group(0);
        }
        set_parent_death_signal(&mut cmd, self.death_signal);
        Ok(cmd)
    }
}

/// Whether a failed start should try another free port (counting the try).
fn retry(error: &LaunchError, tries: &mut usize) -> bool {
    *tries = tries.saturating_sub(1);
    *tries > 0 && matches!(error, LaunchError::AddressInUse { .. })
}

/// The redis-rs URL for `listen`.
pub(crate) fn url(listen: &Listen) -> String {
    match listen {
        Listen::Unix(path) => format!("redis+unix://{}", url_path(path)),
        Listen::Port(port) => format!("redis://127.0.0.1:{port}"),
        Listen::FreePort => unreachable!("resolved to a port by spawn"),
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binary does not exist.
    #[error(
        "redis-server not found (looked for {binary:?}): install it (Debian: sudo apt-get install redis-server)"
    )]
    NotInstalled {
        /// What we tried to execute.
        binary: PathBuf,
    },
    /// An I/O operation failed; the first field says which.
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    /// The server exited because its port or socket was taken.
    #[error("redis-server could not listen at {url}: address already in use")]
    AddressInUse {
        /// Where it tried to listen.
        url: String,
    },
    /// The server was spawned but never answered as ours.
    #[error("redis-server did not become ready: {reason}; last lines of {log:?}:\n{tail}")]
    NotReady {
        /// Why we gave up (timeout, or the child exited).
        reason: String,
        /// The server's log file.
        log: PathBuf,
        /// Its last [`LOG_TAIL_LINES`] lines.
        tail: String,
    },
}

/// A `redis-server` child, killed (with the launch's death signal) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` once reaped.
    child: Option<Child>,
    /// The child's pid, kept for messages after it is reaped.
    pid: u32,
    /// Where it listens, with the port resolved.
    listen: Listen,
    /// Connection URL for redis-rs.
    url: String,
    /// Its `--dir`.
    dir: PathBuf,
    /// Its log file.
    log: PathBuf,
    /// Length of the log before this child, so only its own lines decide
    /// whether it hit a taken address.
    log_start: u64,
    /// Sent on drop.
    death_signal: libc::c_int,
    /// How long `wait_ready` waits.
    ready_timeout: Duration,
    /// The temporary dir, if the launcher made one; declared last so it is
    /// removed only after `Drop` has killed the child.
    _temp: Option<TempDir>,
}

impl RedisServer {
    /// `redis://127.0.0.1:PORT` or `redis+unix:///abs/path.sock`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The TCP port, unless it listens on a unix socket.
    pub fn port(&self) -> Option<u16> {
        match self.listen {
            Listen::Port(port) => Some(port),
            _ => None,
        }
    }

    /// Its working dir (AOF, `nodes.conf`, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its log file: redis's log, stdout and stderr, across restarts in the dir.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The pid of the child, until it is reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is alive. Does not reap it, so it takes `&self`.
    pub fn is_running(&self) -> bool {
        self.child.is_some() && matches!(peek_exit(self.pid, false), Ok(false))
    }

    /// SIGKILL and reap: a crash, with no chance to flush. Does nothing once
    /// reaped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors only mean it has already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (redis fsyncs its AOF and exits), up to `timeout` for it to
    /// exit, then SIGKILL; reaps it. Returns whether it exited in time.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(pid) = self.pid() else {
            return true;
        };
        signal(pid, libc::SIGTERM);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = peek_exit(pid, true);
            let _ = tx.send(());
        });
        let in_time = rx.recv_timeout(timeout).is_ok();
        self.kill();
        in_time
    }

    /// [`RedisServer::terminate`] for async callers.
    pub async fn terminate_async(&mut self, timeout: Duration) -> bool {
        let Some(pid) = self.pid() else {
            return true;
        };
        signal(pid, libc::SIGTERM);
        let in_time = tokio::time::timeout(timeout, self.exited()).await.is_ok();
        self.kill();
        in_time
    }

    /// Waits, without blocking the runtime, until the child exits; reaps it.
    /// Cancel-safe: dropping the future leaves the child as it was.
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        let pid = self.pid;
        let Some(child) = self.child.as_mut() else {
            return Err(io::Error::other(format!("redis-server {pid} already reaped")));
        };
        tokio::task::spawn_blocking(move || peek_exit(pid, true))
            .await
            .map_err(io::Error::other)??;
        let status = child.wait();
        self.child = None;
        status
    }

    /// Blocks until the server answers as ours, the child exits, or the
    /// ready timeout passes. On failure the child is left for the caller
    /// (dropping the server kills it).
    pub fn wait_ready(&mut self) -> Result<(), LaunchError> {
        let mut wait = ReadyWait::new(self.ready_timeout);
        loop {
            self.check_exited()?;
            let last = match probe(&self.url, self.pid) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            std::thread::sleep(wait.next(last).map_err(|r| self.not_ready(r))?);
        }
    }

    /// [`RedisServer::wait_ready`] for async callers.
    pub async fn wait_ready_async(&mut self) -> Result<(), LaunchError> {
        let mut wait = ReadyWait::new(self.ready_timeout);
        loop {
            self.check_exited()?;
            let last = match probe_async(&self.url, self.pid).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            tokio::time::sleep(wait.next(last).map_err(|r| self.not_ready(r))?).await;
        }
    }

    /// An error if the child has exited (it is reaped then).
    fn check_exited(&mut self) -> Result<(), LaunchError> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.not_ready("redis-server was already reaped".into()));
        };
        let reason = match child.try_wait() {
            Ok(None) => return Ok(()),
            Ok(Some(status)) => format!("redis-server exited ({status}) before answering"),
            Err(e) => format!("waiting for redis-server failed: {e}"),
        };
        self.child = None;
        let mut own_lines = Vec::new();
        if let Ok(mut file) = File::open(&self.log)
            && file.seek(SeekFrom::Start(self.log_start)).is_ok()
        {
            let _ = file.read_to_end(&mut own_lines);
        }
        if String::from_utf8_lossy(&own_lines).contains(ADDRESS_IN_USE) {
            return Err(LaunchError::AddressInUse {
                url: self.url.clone(),
            });
        }
        Err(self.not_ready(reason))
    }

    /// A `NotReady` error carrying the log tail.
    fn not_ready(&self, reason: String) -> LaunchError {
        LaunchError::NotReady {
            reason,
            tail: log_tail(&self.log, LOG_TAIL_LINES),
            log: self.log.clone(),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.death_signal == libc::SIGKILL {
            let _ = child.kill();
            let _ = child.wait();
        } else {
            // A gentler signal may take a while to act on: reap elsewhere.
            signal(self.pid, self.death_signal);
            std::thread::spawn(move || child.wait());
        }
    }
}

/// Backoff and deadline of a readiness wait.
struct ReadyWait {
    /// When to give up.
    deadline: Instant,
    /// The wait before the next probe: 5 ms doubling up to 100 ms.
    delay: Duration,
    /// The whole timeout, for the message.
    timeout: Duration,
}

impl ReadyWait {
    /// Starts the clock.
    fn new(timeout: Duration) -> Self {
        ReadyWait {
            deadline: Instant::now() + timeout,
            delay: Duration::from_millis(5),
            timeout,
        }
    }

    /// How long to wait before the next probe, or why to give up.
    fn next(&mut self, last_probe: String) -> Result<Duration, String> {
        if Instant::now() >= self.deadline {
            return Err(format!(
                "not ready within {:?} (last probe: {last_probe})",
                self.timeout
            ));
        }
        let delay = self.delay;
        self.delay = (delay * 2).min(Duration::from_millis(100));
        Ok(delay)
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Whether child `pid` has exited, without reaping it (`WNOWAIT`), so its pid
/// stays ours to signal. With `block`, waits until it has.
fn peek_exit(pid: u32, block: bool) -> io::Result<bool> {
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is its "no child changed" state.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on a pid with a valid out-pointer.
        let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
        if rc == 0 {
            // SAFETY: waitid filled `info` (or left it zeroed).
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One readiness check: `PING` answers (not `-LOADING`), and `INFO server`
/// names `pid` as the answering process.
fn probe(url: &str, pid: u32) -> Result<(), String> {
    let check = || -> redis::RedisResult<redis::InfoDict> {
        let mut con = redis::Client::open(url)?.get_connection_with_timeout(PROBE_TIMEOUT)?;
        con.set_read_timeout(Some(PROBE_TIMEOUT))?;
        con.set_write_timeout(Some(PROBE_TIMEOUT))?;
        redis::cmd("PING").query::<String>(&mut con)?;
        redis::cmd("INFO").arg("server").query(&mut con)
    };
    is_ours(&check().map_err(|e| e.to_string())?, pid)
}

/// [`probe`] for async callers.
async fn probe_async(url: &str, pid: u32) -> Result<(), String> {
    let check = async {
        let mut con = connect_async(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await?;
        redis::cmd("INFO")
            .arg("server")
            .query_async::<redis::InfoDict>(&mut con)
            .await
    };
    let info = tokio::time::timeout(PROBE_TIMEOUT, check)
        .await
        .map_err(|_| "probe timed out".to_string())?
        .map_err(|e| e.to_string())?;
    is_ours(&info, pid)
}

/// Whether `INFO server` came from process `pid`.
fn is_ours(info: &redis::InfoDict, pid: u32) -> Result<(), String> {
    match info.get::<u32>("process_id") {
        Some(answering) if answering == pid => Ok(()),
        Some(answering) => Err(format!(
            "another redis-server (pid {answering}) answers there; ours is {pid}"
        )),
        None => Err("INFO server has no process_id".into()),
    }
}

/// A connection to a local server at `url`, within the probe timeout.
pub(crate) async fn connect_async(
    url: &str,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    tokio::time::timeout(PROBE_TIMEOUT, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "redis connect timed out"))?
}

/// Whether some server answers `PING` at `url` within the probe timeout.
pub(crate) async fn answers(url: &str) -> bool {
    let ping = async {
        let mut con = connect_async(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, ping).await, Ok(Ok(_)))
}

/// The `dir` the server at `url` reports (`CONFIG GET dir`), if it answers
/// within the probe timeout.
pub(crate) async fn config_dir(url: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let get = async {
        let mut con = connect_async(url).await?;
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query_async::<Vec<Vec<u8>>>(&mut con)
            .await
    };
    let mut reply = tokio::time::timeout(PROBE_TIMEOUT, get).await.ok()?.ok()?;
    (reply.len() == 2).then(|| PathBuf::from(OsString::from_vec(reply.swap_remove(1))))
}

/// Percent-encodes a path for a `redis+unix://` URL.
pub(crate) fn url_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The last `n` lines of the log at `path` (reads at most its last 16 KiB).
pub fn log_tail(path: &Path, n: usize) -> String {
    const MAX_BYTES: u64 = 16 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let start = len.saturating_sub(MAX_BYTES);
        file.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let mut lines: Vec<&str> = text.lines().collect();
        if start > 0 && !lines.is_empty() {
            lines.remove(0); // probably cut mid-line
        }
        let from = lines.len().saturating_sub(n);
        Ok(lines[from..].join("\n"))
    };
    match read() {
        Ok(tail) if tail.is_empty() => "(log is empty)".to_string(),
        Ok(tail) => tail,
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}
