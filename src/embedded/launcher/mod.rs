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
//!
//! `server` holds the [`RedisServer`] handle; `probe` the redis-rs probes.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub(crate) use self::probe::{answers, config_dir};
pub use self::server::RedisServer;

mod probe;
mod server;

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
pub const PORT_ATTEMPTS: usize = 5;
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
    /// `requirepass`, which the probe and the server's URL then carry.
    password: Option<String>,
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
            password: None,
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

    /// Requires `password` (URL-safe) of the `default` user
    /// (`--requirepass`); the readiness probe and [`RedisServer::url`] carry it.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self.config("requirepass", password)
    }

    /// Serves TLS on `port` with this certificate, key and CA, without
    /// asking clients for certificates.
    pub fn tls(
        self,
        port: u16,
        cert: impl AsRef<OsStr>,
        key: impl AsRef<OsStr>,
        ca: impl AsRef<OsStr>,
    ) -> Self {
        self.config("tls-port", port.to_string())
            .config("tls-cert-file", cert)
            .config("tls-key-file", key)
            .config("tls-ca-cert-file", ca)
            .config("tls-auth-clients", "no")
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
            url: match &self.password {
                Some(password) if matches!(listen, Listen::Port(_)) => {
                    url(&listen).replacen("://", &format!("://:{password}@"), 1)
                }
                Some(password) => format!("{}?pass={password}", url(&listen)),
                None => url(&listen),
            },
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
