//! Child processes of the bench: its own `redis-server` (through the
//! library's launcher), the service under test, and what can be read about
//! them from `/proc`.
//!
//! Every child is spawned with `PR_SET_PDEATHSIG = SIGKILL` and killed on
//! drop (by a [`ChildGuard`], or by the launcher's handle for Redis), so no
//! child outlives the bench, whether it returns, panics or is killed. The
//! death signal fires when the *thread* that spawned the child exits, so
//! children must be spawned from the main thread (the bench's main future
//! runs there, inside `block_on`), never from a tokio worker or blocking-pool
//! thread, which may exit while the bench still needs the child.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batcher::embedded::launcher::{self, Launch, LaunchError};

/// Makes `cmd`'s child receive SIGKILL when the spawning thread exits, and
/// fail to start if the bench is already gone by the time it starts.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    launcher::set_parent_death_signal(cmd, libc::SIGKILL)
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

/// The bench's own `redis-server`, started by the library's launcher:
/// loopback only, no persistence, in a temporary directory that is removed
/// on drop.
pub struct RedisServer {
    server: launcher::RedisServer,
    pub url: String,
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers PING.
    pub async fn start() -> Result<RedisServer, String> {
        let launch = Launch::new().config("appendonly", "no");
        match launch.start_async().await {
            Ok(server) => Ok(RedisServer {
                url: server.url().to_owned(),
                server,
            }),
            Err(LaunchError::NotInstalled { .. }) => Err("redis-server not found on PATH. \
                 Install it (Debian/Ubuntu: `sudo apt-get install redis-server`, or run \
                 scripts/ensure-redis), or pass --redis-url"
                .into()),
            Err(e) => Err(format!("redis-server did not start: {e}")),
        }
    }

    pub fn pid(&self) -> u32 {
        self.server.pid().unwrap_or(0)
    }
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
        ServiceProc::spawn(&["__serve", "--config-toml", config_toml], &[])
    }

    /// [`ServiceProc::start`] with `env` set for the service.
    pub fn start_with_env(
        config_toml: &str,
        env: &[(&str, String)],
    ) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__serve", "--config-toml", config_toml], env)
    }

    /// Starts the frozen service floor (row 2c) on the Redis at `redis_url`.
    pub fn start_floor(redis_url: &str) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__floor_serve", "--redis-url", redis_url], &[])
    }

    /// Starts this binary with `args` and waits for the address it reports.
    fn spawn(args: &[&str], env: &[(&str, String)]) -> Result<ServiceProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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
    procs: Vec<(String, u32, Option<f64>)>,
    started: Instant,
}

impl CpuMeter {
    pub fn start<N: AsRef<str>>(procs: &[(N, Option<u32>)]) -> CpuMeter {
        CpuMeter {
            procs: procs
                .iter()
                .filter_map(|(name, pid)| {
                    pid.map(|pid| (name.as_ref().to_owned(), pid, cpu_secs(pid)))
                })
                .collect(),
            started: Instant::now(),
        }
    }

    /// The CPU time each process used since [`CpuMeter::start`].
    pub fn finish(&self) -> CpuUse {
        CpuUse {
            wall: self.started.elapsed().as_secs_f64().max(1e-9),
            used: self
                .procs
                .iter()
                .filter_map(|(name, pid, before)| {
                    Some((name.clone(), cpu_secs(*pid)? - (*before)?))
                })
                .collect(),
        }
    }
}

/// The CPU time (user + system) that each metered process used over a window.
#[derive(Default)]
pub struct CpuUse {
    /// The window's wall time, in seconds.
    wall: f64,
    /// Each process that could be read, and its CPU seconds over the window.
    used: Vec<(String, f64)>,
}

impl CpuUse {
    /// This window followed by `other`, as one window: the wall times and
    /// each process's CPU seconds add up.
    pub fn merge(mut self, other: CpuUse) -> CpuUse {
        self.wall += other.wall;
        for (name, seconds) in other.used {
            match self.used.iter_mut().find(|(n, _)| *n == name) {
                Some((_, used)) => *used += seconds,
                None => self.used.push((name, seconds)),
            }
        }
        self
    }

    /// CPU seconds that the process named `name` used, when it was metered.
    pub fn seconds(&self, name: &str) -> Option<f64> {
        self.used.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }
}

/// "redis 97%, service 120%, bench 45%" (percent of one core); "" when
/// nothing could be metered.
impl std::fmt::Display for CpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, used)) in self.used.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{name} {:.0}%", 100.0 * used / self.wall)?;
        }
        Ok(())
    }
}
