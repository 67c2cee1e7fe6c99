//! Embedded, supervised `redis-server` for when the config names no Redis URL.
//!
//! [`EmbeddedRedis::start`] launches a `redis-server` child that keeps its data
//! with AOF under `data_dir` and listens only on `<data_dir>/redis.sock` (or on
//! a loopback TCP port when that socket path would not fit in `sun_path`). It
//! waits until the server answers `PING`, then hands the child to a supervisor
//! task that restarts it with backoff whenever it dies unexpectedly, until
//! [`EmbeddedRedis::stop`] shuts it down cleanly (SIGTERM, bounded wait, then
//! SIGKILL).
//!
//! The child never outlives the service: it gets `PR_SET_PDEATHSIG` (Linux),
//! dropping an [`EmbeddedRedis`] without `stop` sends it SIGTERM, and it runs
//! in its own process group so a terminal's Ctrl-C reaches only the service,
//! which then stops Redis after its own graceful shutdown.
//!
//! A `redis-server` already serving the same data dir (say, one that survived
//! an earlier crash) is never silently shared: starting reports
//! [`EmbeddedError::AlreadyRunning`] instead.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Longest socket path we hand to redis; `sun_path` holds 108 bytes including
/// the NUL, and we keep a margin.
const MAX_UNIX_SOCKET_PATH: usize = 100;
/// How long a freshly spawned server may take to answer PING (AOF load).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a clean shutdown (which fsyncs the AOF) may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// First delay before restarting a crashed server.
const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest delay between restart attempts.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A child that ran at least this long resets the restart backoff.
const STABLE_RUN: Duration = Duration::from_secs(30);
/// Bound on one PING/command round trip to a local server.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How many lines of `redis.log` go into errors and crash logs.
const LOG_TAIL_LINES: usize = 20;
/// Name of the unix socket inside the data dir.
const SOCKET_NAME: &str = "redis.sock";
/// Name of the log file inside the data dir.
const LOG_NAME: &str = "redis.log";
/// Records the TCP port in fallback mode, so a later start can detect a
/// server still running on this data dir.
const PORT_FILE_NAME: &str = "redis.port";

/// How to run the embedded server.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The `redis-server` binary: a path, or a bare name looked up in `PATH`.
    /// Configurable so deployments with Redis outside `PATH` (and tests) work.
    pub redis_server: PathBuf,
    /// Where the AOF, the socket and `redis.log` live; created if missing.
    /// The data survives restarts of the service only because of this.
    pub data_dir: PathBuf,
    /// Redis `appendfsync` policy (`always`, `everysec` or `no`): the
    /// durability/throughput trade-off is the operator's call.
    pub appendfsync: String,
}

/// Errors from starting the embedded server.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The binary does not exist; the message tells how to fix it.
    #[error(
        "redis-server not found (looked for {binary:?}): install it (Debian: sudo apt-get install redis-server) or set [redis] url in the config to use an existing Redis"
    )]
    NotInstalled {
        /// What we tried to execute.
        binary: PathBuf,
    },
    /// Some server already answers on this data dir's endpoint.
    #[error(
        "a redis-server is already running on data dir {data_dir:?} (it answers at {endpoint}); batcher will not share it: stop that server or use another data dir"
    )]
    AlreadyRunning {
        /// The contested data dir.
        data_dir: PathBuf,
        /// Where the other server answered.
        endpoint: String,
    },
    /// The `appendfsync` option is not one Redis accepts.
    #[error("invalid appendfsync policy {value:?}: expected \"always\", \"everysec\" or \"no\"")]
    InvalidAppendfsync {
        /// The rejected value.
        value: String,
    },
    /// An I/O operation failed; the first field says which.
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    /// The server was spawned but never answered PING.
    #[error("embedded redis-server did not become ready: {reason}; last lines of {log:?}:\n{tail}")]
    NotReady {
        /// Why we gave up (timeout, or the child exited).
        reason: String,
        /// The server's log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },
}

/// Where the server listens.
#[derive(Debug, Clone)]
enum Endpoint {
    /// The normal case: a socket inside the data dir, unreachable over the network.
    Unix(PathBuf),
    /// Fallback when the socket path is too long for `sun_path`.
    Tcp(u16),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix socket {}", path.display()),
            Endpoint::Tcp(port) => write!(f, "127.0.0.1:{port}"),
        }
    }
}

/// Everything needed to (re)launch the child; shared by the handle and the
/// supervisor.
#[derive(Debug)]
struct Inner {
    /// Binary to execute.
    redis_server: PathBuf,
    /// Absolute data dir (`--dir`).
    data_dir: PathBuf,
    /// `--appendfsync` policy.
    appendfsync: String,
    /// Fixed for the lifetime of the handle so the client URL stays valid
    /// across restarts.
    endpoint: Endpoint,
    /// Absolute `redis.log`, read for crash reports.
    log_path: PathBuf,
    /// Pid of the live child, or 0; lets `Drop` signal it without owning the
    /// `Child`, which the supervisor task holds.
    pid: AtomicI32,
}

/// A supervised `redis-server` child. Call [`EmbeddedRedis::stop`] to shut it
/// down cleanly; dropping it sends SIGTERM instead.
#[derive(Debug)]
pub struct EmbeddedRedis {
    /// Launch parameters and the current child's pid.
    inner: Arc<Inner>,
    /// Connection URL handed to the redis crate.
    url: String,
    /// Ends the supervisor, which then shuts the child down.
    cancel: CancellationToken,
    /// The supervisor task; awaited by `stop` so it returns only once the
    /// child is gone.
    supervisor: Option<JoinHandle<()>>,
    /// Set by `stop` so `Drop` does not signal a pid that may be reused.
    stopped: bool,
}

impl EmbeddedRedis {
    /// Starts the child, waits until it answers, and spawns the supervisor task.
    pub async fn start(opts: EmbeddedOptions) -> Result<EmbeddedRedis, EmbeddedError> {
        if !matches!(opts.appendfsync.as_str(), "always" | "everysec" | "no") {
            return Err(EmbeddedError::InvalidAppendfsync {
                value: opts.appendfsync,
            });
        }
        fs::create_dir_all(&opts.data_dir).map_err(|e| {
            EmbeddedError::Io(format!("creating data dir {}", opts.data_dir.display()), e)
        })?;
        let data_dir = fs::canonicalize(&opts.data_dir).map_err(|e| {
            EmbeddedError::Io(format!("resolving data dir {}", opts.data_dir.display()), e)
        })?;
        let socket = data_dir.join(SOCKET_NAME);
        let endpoint = if socket.as_os_str().len() <= MAX_UNIX_SOCKET_PATH {
            Endpoint::Unix(socket)
        } else {
            // A server from an earlier run may still hold the recorded port;
            // check it before picking a new one.
            check_tcp_stale(&data_dir).await?;
            let port = free_port()
                .map_err(|e| EmbeddedError::Io("picking a free loopback port".into(), e))?;
            Endpoint::Tcp(port)
        };
        let url = match &endpoint {
            Endpoint::Unix(path) => format!("redis+unix://{}", url_path(path)),
            Endpoint::Tcp(port) => format!("redis://127.0.0.1:{port}"),
        };
        let inner = Arc::new(Inner {
            redis_server: opts.redis_server,
            log_path: data_dir.join(LOG_NAME),
            data_dir,
            appendfsync: opts.appendfsync,
            endpoint,
            pid: AtomicI32::new(0),
        });
        let spawner = Spawner::new()
            .map_err(|e| EmbeddedError::Io("starting the redis-server spawner thread".into(), e))?;
        let cancel = CancellationToken::new();
        let child = match inner.launch(&spawner, &cancel).await? {
            Some(child) => child,
            None => unreachable!("nobody else holds the token yet"),
        };
        tracing::info!(endpoint = %inner.endpoint, data_dir = %inner.data_dir.display(), "embedded redis-server ready");
        let supervisor = tokio::spawn(supervise(
            Arc::clone(&inner),
            spawner,
            child,
            cancel.clone(),
        ));
        Ok(EmbeddedRedis {
            inner,
            url,
            cancel,
            supervisor: Some(supervisor),
            stopped: false,
        })
    }

    /// URL for the redis crate: "redis+unix:///abs/path/redis.sock" or "redis://127.0.0.1:PORT".
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops supervision and shuts the child down cleanly (SIGTERM, bounded wait, then SIGKILL).
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(handle) = self.supervisor.take()
            && let Err(e) = handle.await
        {
            tracing::error!(error = %e, "embedded redis supervisor failed; sending SIGTERM");
            self.inner.signal(libc::SIGTERM);
        }
        // Redis removes its socket on a clean shutdown; clear what a SIGKILL
        // left, unless another server now answers there.
        if command(&self.inner.endpoint, &[b"PING"]).await.is_err() {
            self.inner.remove_endpoint_files();
        }
        self.stopped = true;
        tracing::info!(data_dir = %self.inner.data_dir.display(), "embedded redis-server stopped");
    }
}

impl Drop for EmbeddedRedis {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        // Cancel first so the supervisor takes the exit for a shutdown, not a
        // crash; then signal directly, as the runtime may be going away too.
        self.cancel.cancel();
        self.inner.signal(libc::SIGTERM);
    }
}

impl Inner {
    /// Sends `sig` to the live child, if any.
    fn signal(&self, sig: libc::c_int) {
        let pid = self.pid.load(Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Removes the socket or port file left after the server is gone.
    fn remove_endpoint_files(&self) {
        let path = match &self.endpoint {
            Endpoint::Unix(path) => path.clone(),
            Endpoint::Tcp(_) => self.data_dir.join(PORT_FILE_NAME),
        };
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "could not remove embedded redis endpoint file");
        }
    }

    /// Refuses to share a server that already answers on our endpoint, and
    /// clears a dead one's leftovers.
    async fn preflight(&self) -> Result<(), EmbeddedError> {
        match &self.endpoint {
            Endpoint::Unix(path) => {
                if fs::symlink_metadata(path).is_err() {
                    return Ok(());
                }
                if command(&self.endpoint, &[b"PING"]).await.is_ok() {
                    return Err(EmbeddedError::AlreadyRunning {
                        data_dir: self.data_dir.clone(),
                        endpoint: self.endpoint.to_string(),
                    });
                }
                match fs::remove_file(path) {
                    Ok(()) => {
                        tracing::warn!(path = %path.display(), "removed stale redis socket that nothing answers on");
                        Ok(())
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(EmbeddedError::Io(
                        format!("removing stale socket {}", path.display()),
                        e,
                    )),
                }
            }
            Endpoint::Tcp(_) => check_tcp_stale(&self.data_dir).await,
        }
    }

    /// Builds the command line for the child.
    fn command(&self) -> Result<Command, EmbeddedError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| EmbeddedError::Io(format!("opening {}", self.log_path.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| EmbeddedError::Io(format!("opening {}", self.log_path.display()), e))?;
        let mut cmd = Command::new(&self.redis_server);
        match &self.endpoint {
            Endpoint::Unix(path) => {
                cmd.arg("--port").arg("0");
                cmd.arg("--unixsocket").arg(path);
                cmd.arg("--unixsocketperm").arg("700");
            }
            Endpoint::Tcp(port) => {
                cmd.arg("--port").arg(port.to_string());
                cmd.arg("--bind").arg("127.0.0.1");
            }
        }
        cmd.arg("--dir").arg(&self.data_dir);
        cmd.args(["--appendonly", "yes"]);
        cmd.arg("--appendfsync").arg(&self.appendfsync);
        cmd.args(["--save", "", "--daemonize", "no"]);
        cmd.arg("--logfile").arg(&self.log_path);
        // Anything redis prints before its log is open (config errors) lands
        // in the same log, so crash reports include it.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        // Own process group: a terminal's Ctrl-C must not kill Redis under a
        // service that is still flushing into it.
        cmd.process_group(0);
        // A SIGKILL on drop would skip the AOF fsync; shutdown is explicit.
        cmd.kill_on_drop(false);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getpid is async-signal-safe.
            let parent = unsafe { libc::getpid() };
            // SAFETY: the closure only calls async-signal-safe functions and
            // builds io::Errors from raw codes, which does not allocate.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
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
        Ok(cmd)
    }

    /// Spawns a child and waits until it answers PING. `Ok(None)` means the
    /// token was cancelled meanwhile (the child is then shut down again).
    async fn launch(
        &self,
        spawner: &Spawner,
        cancel: &CancellationToken,
    ) -> Result<Option<Child>, EmbeddedError> {
        self.preflight().await?;
        let cmd = self.command()?;
        let mut child = match spawner.spawn(cmd).await {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(EmbeddedError::NotInstalled {
                    binary: self.redis_server.clone(),
                });
            }
            Err(e) => {
                return Err(EmbeddedError::Io(
                    format!("spawning {}", self.redis_server.display()),
                    e,
                ));
            }
        };
        let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        self.pid.store(pid, Ordering::SeqCst);
        if let Endpoint::Tcp(port) = self.endpoint {
            let path = self.data_dir.join(PORT_FILE_NAME);
            if let Err(e) = fs::write(&path, format!("{port}\n")) {
                tracing::warn!(path = %path.display(), error = %e, "could not record embedded redis port");
            }
        }

        let deadline = Instant::now() + READY_TIMEOUT;
        let mut delay = Duration::from_millis(5);
        loop {
            // -LOADING (AOF still loading) or no connection yet: keep waiting.
            if let Ok(Reply::Simple(s)) = command(&self.endpoint, &[b"PING"]).await
                && s == "PONG"
            {
                return Ok(Some(child));
            }
            if Instant::now() >= deadline {
                self.terminate(&mut child).await;
                return Err(self.not_ready(format!(
                    "no PONG from {} within {:?}",
                    self.endpoint, READY_TIMEOUT
                )));
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.terminate(&mut child).await;
                    return Ok(None);
                }
                status = child.wait() => {
                    self.pid.store(0, Ordering::SeqCst);
                    let reason = match status {
                        Ok(status) => format!("redis-server exited ({status}) before answering"),
                        Err(e) => format!("waiting for redis-server failed: {e}"),
                    };
                    return Err(self.not_ready(reason));
                }
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_millis(100));
        }
    }

    /// A `NotReady` error carrying the log tail.
    fn not_ready(&self, reason: String) -> EmbeddedError {
        EmbeddedError::NotReady {
            reason,
            log: self.log_path.clone(),
            tail: log_tail(&self.log_path, LOG_TAIL_LINES),
        }
    }

    /// Clean shutdown of `child`: SIGTERM (redis fsyncs the AOF), bounded
    /// wait, then SIGKILL.
    async fn terminate(&self, child: &mut Child) {
        if !matches!(child.try_wait(), Ok(Some(_))) {
            self.signal(libc::SIGTERM);
            match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(timeout = ?STOP_TIMEOUT, "embedded redis-server ignored SIGTERM; sending SIGKILL");
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
        self.pid.store(0, Ordering::SeqCst);
    }
}

/// Watches the child and restarts it with backoff until `cancel` fires, then
/// shuts it down.
async fn supervise(
    inner: Arc<Inner>,
    spawner: Spawner,
    mut child: Child,
    cancel: CancellationToken,
) {
    let mut backoff = RESTART_BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let status = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                inner.terminate(&mut child).await;
                return;
            }
            status = child.wait() => status,
        };
        inner.pid.store(0, Ordering::SeqCst);
        if cancel.is_cancelled() {
            return;
        }
        if started.elapsed() >= STABLE_RUN {
            backoff = RESTART_BACKOFF_MIN;
        }
        let status = match status {
            Ok(status) => describe_status(status),
            Err(e) => format!("unknown ({e})"),
        };
        tracing::error!(
            status = %status,
            log = %inner.log_path.display(),
            restart_in = ?backoff,
            "embedded redis-server exited unexpectedly; last lines of its log:\n{}",
            log_tail(&inner.log_path, LOG_TAIL_LINES)
        );
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
            match inner.launch(&spawner, &cancel).await {
                Ok(Some(new_child)) => {
                    tracing::info!(endpoint = %inner.endpoint, "embedded redis-server restarted");
                    child = new_child;
                    break;
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, restart_in = ?backoff, "restarting embedded redis-server failed");
                }
            }
        }
    }
}

/// Exit status as text, naming the signal if there was one.
fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(sig) => format!("killed by signal {sig}"),
        None => status.to_string(),
    }
}

/// A request to the spawner thread: the command and where to send the child.
type SpawnRequest = (Command, oneshot::Sender<io::Result<Child>>);

/// Spawns children from one dedicated thread that lives as long as the
/// supervisor: `PR_SET_PDEATHSIG` fires when the *thread* that forked the
/// child exits, and tokio's blocking-pool threads come and go.
#[derive(Debug)]
struct Spawner {
    /// Requests to the thread; dropping it ends the thread.
    tx: std::sync::mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// Starts the thread; must be called inside a tokio runtime, which the
    /// children are registered with.
    fn new() -> io::Result<Spawner> {
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("embedded-redis-spawner".into())
            .spawn(move || {
                let _runtime = handle.enter();
                while let Ok((mut cmd, reply)) = rx.recv() {
                    if let Err(Ok(child)) = reply.send(cmd.spawn()) {
                        // Nobody waits for this child any more: do not leak it.
                        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                            // SAFETY: kill has no memory-safety preconditions.
                            unsafe {
                                libc::kill(pid, libc::SIGTERM);
                            }
                        }
                    }
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Spawns `cmd` on the spawner thread.
    async fn spawn(&self, cmd: Command) -> io::Result<Child> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .map_err(|_| io::Error::other("redis-server spawner thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("redis-server spawner thread is gone"))?
    }
}

/// In TCP mode: if the port recorded by an earlier run answers and reports
/// our data dir, refuse; otherwise forget the record.
async fn check_tcp_stale(data_dir: &Path) -> Result<(), EmbeddedError> {
    use std::os::unix::ffi::OsStrExt;
    let port_file = data_dir.join(PORT_FILE_NAME);
    let Ok(text) = fs::read_to_string(&port_file) else {
        return Ok(());
    };
    if let Ok(port) = text.trim().parse::<u16>() {
        let endpoint = Endpoint::Tcp(port);
        if let Ok(Reply::Array(items)) = command(&endpoint, &[b"CONFIG", b"GET", b"dir"]).await
            && let Some(Reply::Bulk(dir)) = items.get(1)
            && Path::new(std::ffi::OsStr::from_bytes(dir)) == data_dir
        {
            return Err(EmbeddedError::AlreadyRunning {
                data_dir: data_dir.to_path_buf(),
                endpoint: endpoint.to_string(),
            });
        }
    }
    match fs::remove_file(&port_file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(EmbeddedError::Io(
            format!("removing stale {}", port_file.display()),
            e,
        )),
    }
}

/// A free loopback port, found by binding port 0.
fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Percent-encodes a path for a `redis+unix://` URL.
fn url_path(path: &Path) -> String {
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
fn log_tail(path: &Path, n: usize) -> String {
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

/// A RESP reply, as far as this module needs to understand one.
#[derive(Debug, PartialEq)]
enum Reply {
    /// `+...`
    Simple(String),
    /// `-...` (e.g. `-LOADING`)
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n` (empty for a null bulk)
    Bulk(Vec<u8>),
    /// `*n` (empty for a null array)
    Array(Vec<Reply>),
}

/// Sends one command to `endpoint` on a fresh connection and reads the reply,
/// all within [`PROBE_TIMEOUT`].
async fn command(endpoint: &Endpoint, args: &[&[u8]]) -> io::Result<Reply> {
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        req.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        req.extend_from_slice(arg);
        req.extend_from_slice(b"\r\n");
    }
    let exchange = async {
        match endpoint {
            Endpoint::Unix(path) => roundtrip(UnixStream::connect(path).await?, &req).await,
            Endpoint::Tcp(port) => {
                roundtrip(TcpStream::connect(("127.0.0.1", *port)).await?, &req).await
            }
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "redis probe timed out"))?
}

/// Writes `req` and reads one reply.
async fn roundtrip<S>(stream: S, req: &[u8]) -> io::Result<Reply>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    let mut stream = BufReader::new(stream);
    stream.get_mut().write_all(req).await?;
    read_reply(&mut stream).await
}

/// Reads one RESP2 reply.
fn read_reply<'a, R>(r: &'a mut R) -> Pin<Box<dyn Future<Output = io::Result<Reply>> + Send + 'a>>
where
    R: AsyncBufRead + Unpin + Send,
{
    Box::pin(async move {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let mut line = Vec::new();
        r.read_until(b'\n', &mut line).await?;
        if !line.ends_with(b"\r\n") {
            return Err(bad("truncated RESP line"));
        }
        line.truncate(line.len() - 2);
        let (kind, rest) = line.split_first().ok_or_else(|| bad("empty RESP line"))?;
        let text = String::from_utf8_lossy(rest).into_owned();
        let number = || text.parse::<i64>().map_err(|_| bad("bad RESP length"));
        match kind {
            b'+' => Ok(Reply::Simple(text)),
            b'-' => Ok(Reply::Error(text)),
            b':' => Ok(Reply::Int(number()?)),
            b'$' => {
                let Ok(len) = usize::try_from(number()?) else {
                    return Ok(Reply::Bulk(Vec::new()));
                };
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf).await?;
                buf.truncate(len);
                Ok(Reply::Bulk(buf))
            }
            b'*' => {
                let Ok(len) = usize::try_from(number()?) else {
                    return Ok(Reply::Array(Vec::new()));
                };
                let mut items = Vec::with_capacity(len.min(64));
                for _ in 0..len {
                    items.push(read_reply(r).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(bad("unknown RESP type")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init_tracing() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("info")
            .try_init();
    }

    fn opts(data_dir: &Path) -> EmbeddedOptions {
        EmbeddedOptions {
            redis_server: PathBuf::from("/usr/bin/redis-server"),
            data_dir: data_dir.to_path_buf(),
            appendfsync: "everysec".to_string(),
        }
    }

    async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await
    }

    async fn ping(url: &str) -> redis::RedisResult<String> {
        let mut con = connect(url).await?;
        redis::cmd("PING").query_async(&mut con).await
    }

    fn alive(pid: i32) -> bool {
        // SAFETY: signal 0 only checks for existence.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    /// Start answers PING at its URL with AOF under data_dir; stop ends the process and the socket.
    #[tokio::test]
    async fn start_ping_stop() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data"); // does not exist yet
        let er = EmbeddedRedis::start(opts(&dir)).await.unwrap();
        let canon = fs::canonicalize(&dir).unwrap();
        assert_eq!(
            er.url(),
            format!("redis+unix://{}", canon.join("redis.sock").display())
        );
        assert_eq!(ping(er.url()).await.unwrap(), "PONG");
        assert!(dir.join("appendonlydir").is_dir(), "AOF dir missing");
        assert!(dir.join("redis.log").is_file());
        let pid = er.inner.pid.load(Ordering::SeqCst);
        assert!(pid > 0 && alive(pid));
        er.stop().await;
        assert!(!alive(pid), "redis-server {pid} still running after stop");
        let sock = dir.join("redis.sock");
        assert!(!sock.exists() || UnixStream::connect(&sock).await.is_err());
    }

    /// A key written before stop is still there after starting again on the same dir.
    #[tokio::test]
    async fn data_survives_restart() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        let mut con = connect(er.url()).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("durable")
            .query_async(&mut con)
            .await
            .unwrap();
        drop(con);
        er.stop().await;

        let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        let mut con = connect(er.url()).await.unwrap();
        let v: Option<String> = redis::cmd("GET")
            .arg("k")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some("durable"));
        drop(con);
        er.stop().await;
    }

    /// After the child is SIGKILLed the supervisor restarts it and PING works again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn supervisor_restarts_killed_child() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        let old = er.inner.pid.load(Ordering::SeqCst);
        // SAFETY: plain kill of our own child.
        assert_eq!(unsafe { libc::kill(old, libc::SIGKILL) }, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pid = er.inner.pid.load(Ordering::SeqCst);
            if pid != 0 && pid != old && ping(er.url()).await.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "not restarted in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!alive(old));
        let new = er.inner.pid.load(Ordering::SeqCst);
        er.stop().await;
        assert!(!alive(new));
    }

    /// A missing binary gives NotInstalled with a one-line message naming the apt package.
    #[tokio::test]
    async fn missing_binary_is_not_installed() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let mut o = opts(tmp.path());
        o.redis_server = PathBuf::from("/nonexistent/bin/redis-server");
        let err = EmbeddedRedis::start(o).await.unwrap_err();
        assert!(
            matches!(&err, EmbeddedError::NotInstalled { binary } if binary == Path::new("/nonexistent/bin/redis-server")),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains("apt-get install redis-server"), "{msg}");
        assert!(msg.contains("\"/nonexistent/bin/redis-server\""), "{msg}");
    }

    /// A second start on a data dir whose server is running fails with AlreadyRunning and leaves the first alone.
    #[tokio::test]
    async fn second_start_is_already_running() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let first = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        let err = EmbeddedRedis::start(opts(tmp.path())).await.unwrap_err();
        assert!(
            matches!(err, EmbeddedError::AlreadyRunning { .. }),
            "{err:?}"
        );
        assert_eq!(ping(first.url()).await.unwrap(), "PONG");
        first.stop().await;
    }

    /// A leftover socket file that nothing answers on is removed and the start succeeds.
    #[tokio::test]
    async fn stale_socket_is_removed() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("redis.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap()); // leaves the file
        assert!(sock.exists());
        let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        assert_eq!(ping(er.url()).await.unwrap(), "PONG");
        er.stop().await;
    }

    /// A data dir whose socket path exceeds 100 bytes falls back to loopback TCP, which works and is guarded too.
    #[tokio::test]
    async fn long_path_falls_back_to_tcp() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp
            .path()
            .join("a-rather-long-directory-name-to-overflow-sun-path")
            .join("and-another-long-directory-name-for-good-measure");
        assert!(dir.join("redis.sock").as_os_str().len() > 100);
        let er = EmbeddedRedis::start(opts(&dir)).await.unwrap();
        assert!(er.url().starts_with("redis://127.0.0.1:"), "{}", er.url());
        assert_eq!(ping(er.url()).await.unwrap(), "PONG");
        assert!(!dir.join("redis.sock").exists());
        let err = EmbeddedRedis::start(opts(&dir)).await.unwrap_err();
        assert!(
            matches!(err, EmbeddedError::AlreadyRunning { .. }),
            "{err:?}"
        );
        let pid = er.inner.pid.load(Ordering::SeqCst);
        er.stop().await;
        assert!(!alive(pid));
    }

    /// Dropping the handle without stop still terminates the child.
    #[tokio::test]
    async fn drop_terminates_child() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
        let pid = er.inner.pid.load(Ordering::SeqCst);
        drop(er);
        let deadline = Instant::now() + Duration::from_secs(15);
        while alive(pid) {
            assert!(Instant::now() < deadline, "child survived drop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A child that dies before answering gives NotReady carrying the tail of redis.log.
    #[tokio::test]
    async fn early_exit_is_not_ready_with_log_tail() {
        init_tracing();
        let tmp = tempfile::tempdir().unwrap();
        let mut o = opts(tmp.path());
        // sh rejects redis's arguments on stderr, which goes to redis.log.
        o.redis_server = PathBuf::from("/bin/sh");
        let err = EmbeddedRedis::start(o).await.unwrap_err();
        let EmbeddedError::NotReady { reason, tail, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(reason.contains("exited"), "{reason}");
        assert!(tail.contains("Illegal option"), "{tail}");
        assert!(err.to_string().contains("Illegal option"));
    }

    /// A bad appendfsync policy is rejected before anything is spawned.
    #[tokio::test]
    async fn invalid_appendfsync_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let mut o = opts(tmp.path());
        o.appendfsync = "sometimes".into();
        let err = EmbeddedRedis::start(o).await.unwrap_err();
        assert!(matches!(err, EmbeddedError::InvalidAppendfsync { .. }));
    }

    /// The URL percent-encodes characters a path may hold but a URL may not.
    #[test]
    fn url_path_encodes() {
        assert_eq!(url_path(Path::new("/a b/c%d.sock")), "/a%20b/c%25d.sock");
    }
}
