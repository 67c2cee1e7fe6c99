//! Child processes of the bench: its own `redis-server`, the service under
//! test, and what can be read about them from `/proc`.
//!
//! Every child is spawned with `PR_SET_PDEATHSIG = SIGKILL` and held in a
//! [`ChildGuard`] that kills it on drop, so no child outlives the bench,
//! whether it returns, panics or is killed. The death signal fires when the
//! *thread* that spawned the child exits, so children must be spawned from the
//! main thread (the bench's main future runs there, inside `block_on`), never
//! from a tokio worker or blocking-pool thread, which may exit while the bench
//! still needs the child.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Makes `cmd`'s child receive SIGKILL when the spawning thread exits, and
/// exit at once if the bench is already gone by the time it starts.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// A child process that is killed and reaped when the guard is dropped.
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard { child: Some(child) }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the child has exited (it is reaped if so).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Kills and reaps the child; idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free TCP port on the loopback interface (free when asked; another
/// process could take it before we use it, hence the retries by callers).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The bench's own `redis-server`: loopback only, no persistence, in a
/// temporary directory that is removed on drop.
pub struct RedisServer {
    guard: ChildGuard,
    dir: PathBuf,
    pub url: String,
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers PING.
    pub async fn start() -> Result<RedisServer, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let dir =
            std::env::temp_dir().join(format!("batcher-bench-{}-{nanos:09}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut last_error = String::new();
        for _attempt in 0..3 {
            let port = free_port().map_err(|e| format!("no free port: {e}"))?;
            let log = dir.join("redis.log");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--protected-mode", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            die_with_parent(&mut cmd);
            let child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(
                        "redis-server not found on PATH. Install it (Debian/Ubuntu: \
                         `sudo apt-get install redis-server`, or run scripts/ensure-redis), \
                         or pass --redis-url"
                            .into(),
                    );
                }
                Err(e) => return Err(format!("cannot start redis-server: {e}")),
            };
            let mut server = RedisServer {
                guard: ChildGuard::new(child),
                dir: dir.clone(),
                url: format!("redis://127.0.0.1:{port}"),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if server.guard.exited() {
                    break;
                }
                if ping(&server.url).await.is_ok() {
                    return Ok(server);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            server.guard.stop();
            last_error = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ");
            // Keep the directory for the next attempt: `server` owns a copy of
            // its path and would remove it on drop.
            std::mem::forget(server);
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(format!("redis-server did not start: {last_error}"))
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.guard.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn ping(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await
}

/// The service under test, running as a child (the bench binary re-executed
/// with the hidden `__serve` subcommand), so that its RSS and CPU time can be
/// read from `/proc/<pid>` apart from the load generator's.
pub struct ServiceProc {
    guard: ChildGuard,
    pub addr: SocketAddr,
}

impl ServiceProc {
    /// Starts the service with `config_toml` and waits for the address it listens on.
    pub fn start(config_toml: &str) -> Result<ServiceProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("__serve")
            .arg("--config-toml")
            .arg(config_toml)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the service: {e}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut guard = ChildGuard::new(child);
        // A thread, so that a child that hangs before printing cannot hang
        // the bench: the wait below has a timeout.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "the service did not report its address within 20 s".to_string())?;
        let addr = line
            .trim()
            .strip_prefix("LISTENING ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                guard.stop();
                format!(
                    "the service failed to start (first line: {:?})",
                    line.trim()
                )
            })?;
        Ok(ServiceProc { guard, addr })
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }
}

/// Resident set size of a process, in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// User plus system CPU time of a process so far, in seconds (`/proc/<pid>/stat`).
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks.max(1.0))
}

/// CPU use of a set of processes over a window, as a percentage of one core.
pub struct CpuMeter {
    procs: Vec<(&'static str, u32, Option<f64>)>,
    started: Instant,
}

impl CpuMeter {
    pub fn start(procs: &[(&'static str, Option<u32>)]) -> CpuMeter {
        CpuMeter {
            procs: procs
                .iter()
                .filter_map(|(name, pid)| pid.map(|pid| (*name, pid, cpu_secs(pid))))
                .collect(),
            started: Instant::now(),
        }
    }

    /// "redis 97%, service 120%, bench 45%" (percent of one core).
    pub fn finish(&self) -> String {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        self.procs
            .iter()
            .filter_map(|(name, pid, before)| {
                let used = cpu_secs(*pid)? - (*before)?;
                Some(format!("{name} {:.0}%", 100.0 * used / wall))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
