//! Scenarios 1 and 2, ingest: closed-loop callers add items under 10k keys
//! (the default policy, max_items 10, so groups flush by SIZE as they fill)
//! through AddMany or unary Add, counting the items added inside the window
//! and metering every process's CPU over that window.

use batcher::pb;

use super::load::{Done, LoadStats, Rng, add_request, added, closed_loop, connect_many, id, key};
use super::procs::CpuUse;
use super::scenarios::{Sizes, Target};

/// Throughput of an ingest scenario, and the CPU each process used meanwhile.
pub struct Ingest {
    pub stats: LoadStats,
    pub cpu: CpuUse,
}

impl Ingest {
    /// redis-server's CPU time over the window divided by the items added in
    /// it, in µs: the Redis work per item. None when Redis is not the bench's
    /// own (its CPU time cannot be read) or nothing was added.
    pub fn redis_us_per_item(&self) -> Option<f64> {
        let secs = self.cpu.seconds("redis")?;
        (self.stats.added > 0).then(|| secs * 1e6 / self.stats.added as f64)
    }
}

/// Keys the ingest scenarios spread their items over.
pub const INGEST_KEYS: u64 = 10_000;

/// Scenario 1: AddMany calls of 100 items over 10k keys, from 16 callers over
/// 4 HTTP/2 connections.
pub async fn ingest_add_many(t: &Target, s: &Sizes, run: &str) -> Result<Ingest, String> {
    const CALLERS: usize = 16;
    const CONNECTIONS: usize = 4;
    const BATCH: u64 = 100;
    let clients = connect_many(t.addr, CONNECTIONS).await?;
    let cpu = t.cpu_during(s.warmup, s.window);
    let run = run.to_string();
    let stats = closed_loop(CALLERS, s.warmup, s.window, move |caller, seq| {
        let mut client = clients[caller % CONNECTIONS].clone();
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let items = (0..BATCH)
            .map(|i| {
                add_request(
                    key("am", &run, rng.below(INGEST_KEYS)),
                    id(&run, caller, seq * BATCH + i),
                )
            })
            .collect();
        async move {
            let response = client
                .add_many(pb::AddManyRequest { items })
                .await
                .map_err(|s| format!("AddMany: {}", s.message()))?
                .into_inner();
            let ok = added(&response.results);
            Ok(Done {
                added: ok,
                duplicates: response.results.len() as u64 - ok,
            })
        }
    })
    .await?;
    let cpu = cpu.await.unwrap_or_default();
    Ok(Ingest { stats, cpu })
}

/// Scenario 2: unary Add calls over 10k keys from 64 callers over 8 HTTP/2
/// connections.
pub async fn ingest_add(t: &Target, s: &Sizes, run: &str) -> Result<Ingest, String> {
    const CALLERS: usize = 64;
    const CONNECTIONS: usize = 8;
    let clients = connect_many(t.addr, CONNECTIONS).await?;
    let cpu = t.cpu_during(s.warmup, s.window);
    let run = run.to_string();
    let stats = closed_loop(CALLERS, s.warmup, s.window, move |caller, seq| {
        let mut client = clients[caller % CONNECTIONS].clone();
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let request = add_request(
            key("ad", &run, rng.below(INGEST_KEYS)),
            id(&run, caller, seq),
        );
        async move {
            let response = client
                .add(request)
                .await
                .map_err(|s| format!("Add: {}", s.message()))?
                .into_inner();
            let ok = u64::from(response.outcome == pb::AddOutcome::Added as i32);
            Ok(Done {
                added: ok,
                duplicates: 1 - ok,
            })
        }
    })
    .await?;
    let cpu = cpu.await.unwrap_or_default();
    Ok(Ingest { stats, cpu })
}
