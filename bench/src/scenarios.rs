//! What every service scenario shares: the [`Target`] it runs against (a
//! fresh service, and an emptied Redis when the bench owns it), the [`Sizes`]
//! of a full or quick run, and the few Redis reads the figures need. The
//! scenarios themselves are `ingest.rs` (1, 2), `precision.rs` (3),
//! `fanout.rs` (4), `scale.rs` (5 to 7), `remembered.rs` (8),
//! `overload.rs` (10), `policies.rs` (11) and `calls.rs` (12); the bin's
//! module doc says how each figure is computed.

use std::net::SocketAddr;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use super::procs::{CpuMeter, CpuUse, rss_kib};

/// The service and Redis a scenario runs against.
pub struct Target {
    pub addr: SocketAddr,
    /// Known when the bench started the service.
    pub service_pid: Option<u32>,
    /// Known when the bench started Redis.
    pub redis_pid: Option<u32>,
    pub redis_url: String,
    /// The masters' pids when the target is the bench's own cluster (CPU
    /// is metered per master, as "master 1", "master 2", ...); else empty.
    pub masters: Vec<u32>,
}

impl Target {
    fn processes(&self) -> Vec<(String, Option<u32>)> {
        let mut procs = vec![
            ("redis".to_owned(), self.redis_pid),
            ("service".to_owned(), self.service_pid),
            ("bench".to_owned(), Some(std::process::id())),
        ];
        for (i, pid) in self.masters.iter().enumerate() {
            procs.push((master_name(i), Some(*pid)));
        }
        procs
    }

    /// Starts measuring CPU use of Redis, the service and the bench.
    pub fn cpu_meter(&self) -> CpuMeter {
        CpuMeter::start(&self.processes())
    }

    /// Measures CPU use over the window that starts after `warmup` and lasts `window`.
    pub fn cpu_during(&self, warmup: Duration, window: Duration) -> JoinHandle<CpuUse> {
        let procs = self.processes();
        tokio::spawn(async move {
            tokio::time::sleep(warmup).await;
            let meter = CpuMeter::start(&procs);
            tokio::time::sleep(window).await;
            meter.finish()
        })
    }

    /// The service's RSS in KiB, when the bench started it.
    pub fn rss(&self) -> Option<u64> {
        self.service_pid.and_then(rss_kib)
    }
}

/// The name the CPU figures give the i-th master (from 0) of a cluster.
pub fn master_name(i: usize) -> String {
    format!("master {}", i + 1)
}

/// How big each scenario is: full, or the quick smoke run.
pub struct Sizes {
    pub warmup: Duration,
    pub window: Duration,
    pub precision_groups: usize,
    pub precision_waits: Vec<Duration>,
    pub fanout_window: Duration,
    pub scale_small: usize,
    pub scale_large: usize,
    pub probes: usize,
    /// Items flushed through the service to fill the dedup sets (scenario 8).
    pub remembered: usize,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
        Sizes {
            warmup: Duration::from_millis(if quick { 500 } else { 1000 }),
            window: Duration::from_secs(if quick { 2 } else { 10 }),
            precision_groups: if quick { 5_000 } else { 100_000 },
            precision_waits: precision_waits(quick),
            fanout_window: Duration::from_secs(if quick { 2 } else { 10 }),
            scale_small: 1_000,
            scale_large: if quick { 20_000 } else { 1_000_000 },
            probes: if quick { 1_000 } else { 20_000 },
            remembered: if quick { 20_000 } else { 200_000 },
        }
    }
}

/// The `max_wait` values of the timeout-precision groups: K evenly spaced
/// waits, one key glob each. Opening every group within one step and giving
/// group i the wait i mod K spreads the due times evenly over K steps: 60 s
/// (5 s to 65 s after the start) in the full run, 5 s in the quick one.
pub fn precision_waits(quick: bool) -> Vec<Duration> {
    let (globs, step) = if quick { (5, 1) } else { (12, 5) };
    (1..=globs).map(|k| Duration::from_secs(k * step)).collect()
}

/// A connection to the Redis at `url`.
pub async fn redis_connection(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis: {e}"))
}

/// One section of INFO, and the value of `field` in it.
async fn info_field(url: &str, section: &str, field: &str) -> Result<Option<String>, String> {
    let mut conn = redis_connection(url).await?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO {section}: {e}"))?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string()))
}

/// Redis's `used_memory` (bytes), from INFO memory.
pub async fn used_memory(url: &str) -> Result<u64, String> {
    info_field(url, "memory", "used_memory")
        .await?
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".to_string())
}

/// The server's version, from INFO server.
pub async fn redis_version(url: &str) -> String {
    match info_field(url, "server", "redis_version").await {
        Ok(Some(version)) => version,
        _ => "unknown".into(),
    }
}

/// Calls and total microseconds of the library's functions so far (`FCALL`,
/// from INFO commandstats): adds and removes, and the sweepers' due scans.
pub async fn script_stats(url: &str) -> Result<(u64, u64), String> {
    command_stats(url, "fcall").await
}

/// Calls and total microseconds of `command` (lower case) so far, from INFO
/// commandstats; zeros when Redis has not run it yet.
pub async fn command_stats(url: &str, command: &str) -> Result<(u64, u64), String> {
    let field_name = format!("cmdstat_{command}");
    let Some(line) = info_field(url, "commandstats", &field_name).await? else {
        return Ok((0, 0));
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((field("calls"), field("usec")))
}
