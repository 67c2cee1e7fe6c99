//! [`RedisServer`], the handle on one launched child: readiness waits, exit
//! waits, termination, and the kill on drop.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::probe::{probe, probe_async};
use super::{ADDRESS_IN_USE, LOG_TAIL_LINES, LaunchError, Listen, log_tail};

/// A `redis-server` child, killed (with the launch's death signal) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` once reaped.
    pub(super) child: Option<Child>,
    /// The child's pid, kept for messages after it is reaped.
    pub(super) pid: u32,
    /// Where it listens, with the port resolved.
    pub(super) listen: Listen,
    /// Connection URL for redis-rs.
    pub(super) url: String,
    /// Its `--dir`.
    pub(super) dir: PathBuf,
    /// Its log file.
    pub(super) log: PathBuf,
    /// Length of the log before this child, so only its own lines decide
    /// whether it hit a taken address.
    pub(super) log_start: u64,
    /// Sent on drop.
    pub(super) death_signal: libc::c_int,
    /// How long `wait_ready` waits.
    pub(super) ready_timeout: Duration,
    /// The temporary dir, if the launcher made one; declared last so it is
    /// removed only after `Drop` has killed the child.
    pub(super) _temp: Option<TempDir>,
}

impl RedisServer {
    /// `redis://127.0.0.1:PORT` or `redis+unix:///abs/path.sock`, with the
    /// password when [`Launch::password`](super::Launch::password) set one.
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
            return Err(io::Error::other(format!(
                "redis-server {pid} already reaped"
            )));
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
