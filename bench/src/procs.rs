//! Child processes of the bench: its own `redis-server` and the service
//! under test, both started with the testkit (`batcher-testkit`, which the
//! integration tests use too), and what can be read about them from `/proc`.
//!
//! Every child is spawned with `PR_SET_PDEATHSIG = SIGKILL` and killed on
//! drop, so no child outlives the bench, whether it returns, panics or is
//! killed. The death signal fires when the *thread* that spawned the child
//! exits, so children must be spawned from the main thread (the bench's main
//! future runs there, inside `block_on`), never from a tokio worker or
//! blocking-pool thread, which may exit while the bench still needs the child.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batcher::embedded::launcher::LaunchError;
pub use batcher_testkit::RedisServer;
use batcher_testkit::{AddrLine, Process, Spawn};
use tempfile::TempDir;

/// How long the service may take to report its address.
const SERVICE_START: Duration = Duration::from_secs(20);

/// Starts the bench's own `redis-server` on a free loopback port, with no
/// persistence, in a temporary directory that is removed on drop.
pub fn start_redis() -> Result<RedisServer, String> {
    let builder = RedisServer::builder().appendonly(false);
    builder.try_start().map_err(|e| match e {
        LaunchError::NotInstalled { .. } => "redis-server not found on PATH. \
             Install it (Debian/Ubuntu: `sudo apt-get install redis-server`, or run \
             scripts/ensure-redis), or pass --redis-url"
            .into(),
        e => format!("redis-server did not start: {e}"),
    })
}

/// The service under test, running as a child (the bench binary re-executed
/// with the hidden `__serve` subcommand), so that its RSS and CPU time can be
/// read from `/proc/<pid>` apart from the load generator's.
pub struct ServiceProc {
    /// The child, which prints `LISTENING <addr>` on its stdout (into a log
    /// file) and its own messages on the bench's stderr.
    process: Process,
    /// Where it serves gRPC.
    pub addr: SocketAddr,
    /// Holds the stdout log; declared last, so it is removed after the
    /// child is killed.
    _dir: TempDir,
}

impl ServiceProc {
    /// Starts the service with `config_toml` and waits for the address it listens on.
    pub async fn start(config_toml: &str) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__serve", "--config-toml", config_toml], &[]).await
    }

    /// [`ServiceProc::start`] with `env` set for the service.
    pub async fn start_with_env(
        config_toml: &str,
        env: &[(&str, String)],
    ) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__serve", "--config-toml", config_toml], env).await
    }

    /// Starts the frozen service floor (row 2c) on the Redis at `redis_url`.
    pub async fn start_floor(redis_url: &str) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__floor_serve", "--redis-url", redis_url], &[]).await
    }

    /// Starts the frozen AddMany service floor (row 1c) on the Redis at
    /// `redis_url`.
    pub async fn start_floor_many(redis_url: &str) -> Result<ServiceProc, String> {
        ServiceProc::spawn(&["__floor_serve_many", "--redis-url", redis_url], &[]).await
    }

    /// Starts this binary with `args` and waits for the address it reports.
    async fn spawn(args: &[&str], env: &[(&str, String)]) -> Result<ServiceProc, String> {
        let program = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let dir = tempfile::Builder::new()
            .prefix("batcher-bench-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        let listening = AddrLine::Prefix("LISTENING ".into());
        let spawn = Spawn::new(program, dir.path().join("stdout.log"), listening)
            .args(args)
            .stderr_inherit()
            .timeout(SERVICE_START);
        let spawn = env
            .iter()
            .fold(spawn, |spawn, (key, value)| spawn.env(key, value));
        let process = spawn
            .run()
            .await
            .map_err(|e| format!("the service failed to start: {e}"))?;
        Ok(ServiceProc {
            addr: process.addr,
            process,
            _dir: dir,
        })
    }

    /// The service's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
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
