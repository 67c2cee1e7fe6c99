//! Scenario 12, adds per call: unary Add through the service at 1, 8 and 64
//! closed-loop callers, and how many adds each Redis call of the add path
//! carried. A shard's writer runs one `FCALL` of the add function for
//! whatever adds queued up while its previous call ran, so one caller gets
//! exactly one add per call, and more callers share calls.
//!
//! Redis counts `FCALL`s in `INFO commandstats` (`cmdstat_fcall`) without
//! telling the functions apart, so the count over a window also holds the
//! sweepers' due scans. Their rate is measured with the service idle just
//! before the load, and that rate times the window is taken off each
//! level's count. Under load a sweeper scans a little more often (an add
//! that opens a group while its shard's scan is in flight wakes it for
//! another), so the figure errs low, if anything; at one caller it must be
//! 1.0, which checks the subtraction.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::ingest::{INGEST_KEYS, unary_add};
use super::load::{LoadStats, Rng, add_request, closed_loop, connect_many, id, key};
use super::procs::CpuUse;
use super::scenarios::{Sizes, Target, command_stats};

/// The callers of each level, in the order they run.
pub const CALLERS: [usize; 3] = [1, 8, 64];
/// At most this many HTTP/2 connections, shared round-robin (scenario 2's).
const CONNECTIONS: usize = 8;

/// One level: its callers, what the load measured, the CPU each process
/// used, and the `FCALL`s Redis ran, all over the window.
pub struct Level {
    pub callers: usize,
    pub connections: usize,
    pub stats: LoadStats,
    pub cpu: CpuUse,
    /// Every `FCALL` over the window: the add path's and the sweepers'.
    pub fcalls: u64,
}

/// Every level, and the idle rate of `FCALL`s taken off their counts.
pub struct AddsPerCall {
    pub levels: Vec<Level>,
    /// `FCALL`s per second with the service idle: the sweepers' due scans.
    pub idle_per_sec: f64,
    /// How long the idle rate was measured.
    pub idle: Duration,
}

impl Level {
    /// The add path's calls over the window: every `FCALL` less the idle
    /// rate over the window.
    pub fn add_calls(&self, idle_per_sec: f64) -> f64 {
        self.fcalls as f64 - idle_per_sec * self.stats.window.as_secs_f64()
    }

    /// Adds per call of the add path; None when no call is left.
    pub fn adds_per_call(&self, idle_per_sec: f64) -> Option<f64> {
        let calls = self.add_calls(idle_per_sec);
        (calls >= 1.0).then(|| self.stats.added as f64 / calls)
    }
}

/// Measures the idle rate for `idle`, then runs each level of [`CALLERS`]
/// for the warm-up and the window, on the one service `t` names.
pub async fn adds_per_call(
    t: &Target,
    s: &Sizes,
    run: &str,
    idle: Duration,
) -> Result<AddsPerCall, String> {
    // Let every shard's sweeper settle into its rhythm first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (before, _) = command_stats(&t.redis_url, "fcall").await?;
    tokio::time::sleep(idle).await;
    let (after, _) = command_stats(&t.redis_url, "fcall").await?;
    let idle_per_sec = after.saturating_sub(before) as f64 / idle.as_secs_f64();
    let mut levels = Vec::new();
    for (n, callers) in CALLERS.into_iter().enumerate() {
        levels.push(level(t, s, run, n, callers).await?);
    }
    Ok(AddsPerCall {
        levels,
        idle_per_sec,
        idle,
    })
}

/// One level: `callers` unary Add callers over 10k keys (the keys are shared
/// by the levels; the ids are not), metered over the window.
async fn level(
    t: &Target,
    s: &Sizes,
    run: &str,
    n: usize,
    callers: usize,
) -> Result<Level, String> {
    let connections = callers.min(CONNECTIONS);
    let clients = connect_many(t.addr, connections).await?;
    let cpu = t.cpu_during(s.warmup, s.window);
    let fcalls = fcalls_during(t.redis_url.clone(), s.warmup, s.window);
    let run = run.to_string();
    let stats = closed_loop(callers, s.warmup, s.window, move |caller, seq| {
        let client = clients[caller % connections].clone();
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let request = add_request(
            key("ac", &run, rng.below(INGEST_KEYS)),
            id(&run, n * 1000 + caller, seq),
        );
        unary_add(client, request)
    })
    .await?;
    let cpu = cpu.await.unwrap_or_default();
    let fcalls = fcalls
        .await
        .map_err(|e| format!("reading INFO commandstats: {e}"))??;
    Ok(Level {
        callers,
        connections,
        stats,
        cpu,
        fcalls,
    })
}

/// The `FCALL`s Redis runs over the window that starts after `warmup` and
/// lasts `window`.
fn fcalls_during(
    url: String,
    warmup: Duration,
    window: Duration,
) -> JoinHandle<Result<u64, String>> {
    tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        let (before, _) = command_stats(&url, "fcall").await?;
        tokio::time::sleep(window).await;
        let (after, _) = command_stats(&url, "fcall").await?;
        Ok(after.saturating_sub(before))
    })
}
