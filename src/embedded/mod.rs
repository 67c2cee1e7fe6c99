//! Embedded, supervised `redis-server` for when the config names no Redis URL,
//! and the [`launcher`] that every `redis-server` child of this project
//! (embedded mode, the bench, the test harness) is started with.
//!
//! [`EmbeddedRedis::start`] launches a `redis-server` child that keeps its data
//! with AOF under `data_dir` and listens only on `<data_dir>/redis.sock` (or on
//! a loopback TCP port when that socket path would not fit in `sun_path`). It
//! waits until the server answers `PING`, then hands the child to a supervisor
//! task (`supervisor`) that restarts it with backoff whenever it dies
//! unexpectedly, until [`EmbeddedRedis::stop`] shuts it down cleanly (SIGTERM,
//! bounded wait, then SIGKILL).
//!
//! The child never outlives the service: it gets `PR_SET_PDEATHSIG` (Linux),
//! dropping an [`EmbeddedRedis`] without `stop` sends it SIGTERM, and it runs
//! in its own process group so a terminal's Ctrl-C reaches only the service,
//! which then stops Redis after its own graceful shutdown.
//!
//! A `redis-server` already serving the same data dir (say, one that survived
//! an earlier crash) is never silently shared: starting reports
//! [`EmbeddedError::AlreadyRunning`] instead.

pub mod launcher;
mod supervisor;
#[cfg(test)]
mod tests;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::launcher::{Launch, LaunchError, Listen};
use self::supervisor::Spawner;
use crate::config::AppendFsync;

/// Longest socket path we hand to redis; `sun_path` holds 108 bytes including
/// the NUL, and we keep a margin.
const MAX_UNIX_SOCKET_PATH: usize = 100;
/// How long a freshly spawned server may take to answer PING (AOF load).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Name of the unix socket inside the data dir.
const SOCKET_NAME: &str = "redis.sock";
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
    /// Redis `appendfsync` policy: the durability/throughput trade-off is
    /// the operator's call.
    pub appendfsync: AppendFsync,
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

impl From<LaunchError> for EmbeddedError {
    fn from(e: LaunchError) -> Self {
        match e {
            LaunchError::NotInstalled { binary } => EmbeddedError::NotInstalled { binary },
            LaunchError::Io(what, e) => EmbeddedError::Io(what, e),
            LaunchError::AddressInUse { url } => EmbeddedError::Io(
                format!("starting redis-server at {url}"),
                io::ErrorKind::AddrInUse.into(),
            ),
            LaunchError::NotReady { reason, log, tail } => {
                EmbeddedError::NotReady { reason, log, tail }
            }
        }
    }
}

/// Everything needed to (re)launch the child; shared by the handle and the
/// supervisor.
#[derive(Debug)]
struct Inner {
    /// How to launch the child; the same for every restart.
    launch: Launch,
    /// Absolute data dir (`--dir`).
    data_dir: PathBuf,
    /// Fixed for the lifetime of the handle so the client URL stays valid
    /// across restarts.
    listen: Listen,
    /// Connection URL handed to the redis crate.
    url: String,
    /// Absolute `redis.log`, read for crash reports.
    log_path: PathBuf,
    /// Pid of the live child, or 0; lets `Drop` signal it without owning the
    /// child, which the supervisor task holds.
    pid: AtomicI32,
}

/// A supervised `redis-server` child. Call [`EmbeddedRedis::stop`] to shut it
/// down cleanly; dropping it sends SIGTERM instead.
#[derive(Debug)]
pub struct EmbeddedRedis {
    /// Launch parameters and the current child's pid.
    inner: Arc<Inner>,
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
        let inner = Arc::new(Inner::new(opts).await?);
        let spawner = Spawner::new()
            .map_err(|e| EmbeddedError::Io("starting the redis-server spawner thread".into(), e))?;
        let cancel = CancellationToken::new();
        let child = match inner.launch(&spawner, &cancel).await? {
            Some(child) => child,
            None => unreachable!("nobody else holds the token yet"),
        };
        tracing::info!(url = %inner.url, data_dir = %inner.data_dir.display(), "embedded redis-server ready");
        let supervisor = tokio::spawn(supervisor::supervise(
            Arc::clone(&inner),
            spawner,
            child,
            cancel.clone(),
        ));
        Ok(EmbeddedRedis {
            inner,
            cancel,
            supervisor: Some(supervisor),
            stopped: false,
        })
    }

    /// URL for the redis crate: "redis+unix:///abs/path/redis.sock" or "redis://127.0.0.1:PORT".
    pub fn url(&self) -> &str {
        &self.inner.url
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
        if !launcher::answers(&self.inner.url).await {
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
    /// Validates `opts`, prepares the data dir and picks the endpoint.
    async fn new(opts: EmbeddedOptions) -> Result<Inner, EmbeddedError> {
        fs::create_dir_all(&opts.data_dir).map_err(|e| {
            EmbeddedError::Io(format!("creating data dir {}", opts.data_dir.display()), e)
        })?;
        let data_dir = fs::canonicalize(&opts.data_dir).map_err(|e| {
            EmbeddedError::Io(format!("resolving data dir {}", opts.data_dir.display()), e)
        })?;
        let socket = data_dir.join(SOCKET_NAME);
        let listen = if socket.as_os_str().len() <= MAX_UNIX_SOCKET_PATH {
            Listen::Unix(socket)
        } else {
            // A server from an earlier run may still hold the recorded port;
            // check it before picking a new one.
            check_tcp_stale(&data_dir).await?;
            let port = launcher::free_port()
                .map_err(|e| EmbeddedError::Io("picking a free loopback port".into(), e))?;
            Listen::Port(port)
        };
        let launch = Launch::new()
            .binary(opts.redis_server)
            .dir(&data_dir)
            .listen(listen.clone())
            .config("appendonly", "yes")
            .config("appendfsync", opts.appendfsync.as_str())
            .death_signal(libc::SIGTERM)
            .own_process_group()
            .ready_timeout(READY_TIMEOUT);
        Ok(Inner {
            launch,
            log_path: data_dir.join(launcher::LOG_NAME),
            url: launcher::url(&listen),
            data_dir,
            listen,
            pid: AtomicI32::new(0),
        })
    }

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

    /// Where the server listens, for messages.
    fn endpoint(&self) -> String {
        endpoint(&self.listen)
    }

    /// Removes the socket or port file left after the server is gone.
    fn remove_endpoint_files(&self) {
        let path = match &self.listen {
            Listen::Unix(path) => path.clone(),
            _ => self.data_dir.join(PORT_FILE_NAME),
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
        let Listen::Unix(path) = &self.listen else {
            return check_tcp_stale(&self.data_dir).await;
        };
        if fs::symlink_metadata(path).is_err() {
            return Ok(());
        }
        if launcher::answers(&self.url).await {
            return Err(EmbeddedError::AlreadyRunning {
                data_dir: self.data_dir.clone(),
                endpoint: self.endpoint(),
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
}

/// `listen` for messages: "unix socket PATH" or "127.0.0.1:PORT".
fn endpoint(listen: &Listen) -> String {
    match listen {
        Listen::Unix(path) => format!("unix socket {}", path.display()),
        Listen::Port(port) => format!("127.0.0.1:{port}"),
        Listen::FreePort => "a free loopback port".into(),
    }
}

/// In TCP mode: if the port recorded by an earlier run answers and reports
/// our data dir, refuse; otherwise forget the record.
async fn check_tcp_stale(data_dir: &Path) -> Result<(), EmbeddedError> {
    let port_file = data_dir.join(PORT_FILE_NAME);
    let Ok(text) = fs::read_to_string(&port_file) else {
        return Ok(());
    };
    if let Ok(port) = text.trim().parse::<u16>() {
        let listen = Listen::Port(port);
        if launcher::config_dir(&launcher::url(&listen))
            .await
            .as_deref()
            == Some(data_dir)
        {
            return Err(EmbeddedError::AlreadyRunning {
                data_dir: data_dir.to_path_buf(),
                endpoint: endpoint(&listen),
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
