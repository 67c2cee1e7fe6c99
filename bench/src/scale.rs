//! Scenarios 5 to 7, scale: Add latency, Redis memory and service RSS over
//! 1k and over 1M (quick: 20k) open one-item groups, each probed on a freshly
//! started service so that the number of open groups is the only difference.

use std::sync::Arc;
use std::time::Instant;

use batcher::pb;
use hdrhistogram::Histogram;
use tokio::task::JoinSet;

use super::load::{add_request, connect_many, fill, histogram, id, key, record};
use super::procs::CpuUse;
use super::scenarios::{Sizes, Target, script_stats, used_memory};
use super::service::Env;

/// What scenarios 5 to 7 measured.
pub struct ScaleResult {
    pub small: usize,
    pub large: usize,
    /// Add latency (µs) of the probe on a fresh service over `small` and over
    /// `large` open groups: the same service history, so the number of open
    /// groups is the only difference.
    pub probe_small: Probe,
    pub probe_large: Probe,
    /// The probe on the service that had just opened the `large` groups.
    pub probe_after_ingest: Probe,
    /// Probes on that service on the way, at each power of ten between
    /// `small` and `large` (10k and 100k; quick: 10k): (open groups, probe).
    pub on_the_way: Vec<(usize, Probe)>,
    /// Redis used_memory before and after opening `large - small` groups.
    pub memory_before: u64,
    pub memory_after: u64,
    /// RSS of a fresh service after a probe, over `small` and over `large`
    /// open groups: the same history, so any difference is per-group state.
    pub rss_small: Option<u64>,
    pub rss_large: Option<u64>,
    /// RSS of the service that opened the groups, after its probe.
    pub rss_after_ingest: Option<u64>,
    pub fill_per_sec: f64,
    pub fill_cpu: CpuUse,
}

/// A probe's Add latency, and the Redis time per script call meanwhile, which
/// tells Redis's share of a latency change from the rest of the path.
pub struct Probe {
    pub latency: Histogram<u64>,
    pub redis_us_per_call: f64,
}

async fn probe(target: &Target, run: &str, round: char, total: usize) -> Result<Probe, String> {
    let (calls, usec) = script_stats(&target.redis_url).await?;
    let latency = probe_latency(target, run, round, total).await?;
    let (calls_after, usec_after) = script_stats(&target.redis_url).await?;
    Ok(Probe {
        latency,
        redis_us_per_call: (usec_after - usec) as f64 / (calls_after - calls).max(1) as f64,
    })
}

/// Scenarios 5 to 7 on one growing set of groups: open 1k; on a fresh
/// service, probe and read RSS; open up to 1M with Redis memory read around
/// it (probing at each power of ten on the way) and probe again on that
/// service; then probe and read RSS on another fresh service. Restarts the service, so it runs on the main future (see
/// procs.rs).
pub async fn scale(env: &mut Env, sizes: &Sizes, run: &str) -> Result<ScaleResult, String> {
    let (small, large) = (sizes.scale_small, sizes.scale_large);
    let target = env.fresh(true).await?;
    open_groups(&target, 0..small, run, 10).await?;

    let target = env.fresh(false).await?;
    let probe_small = probe(&target, run, 'p', sizes.probes).await?;
    let rss_small = target.rss();
    let memory_before = used_memory(&target.redis_url).await?;
    let (fill_per_sec, fill_cpu, on_the_way) =
        open_probing(&target, small, large, run, sizes.probes).await?;
    let memory_after = used_memory(&target.redis_url).await?;
    let probe_after_ingest = probe(&target, run, 'q', sizes.probes).await?;
    let rss_after_ingest = target.rss();

    let target = env.fresh(false).await?;
    let probe_large = probe(&target, run, 'r', sizes.probes).await?;
    let rss_large = target.rss();
    Ok(ScaleResult {
        small,
        large,
        probe_small,
        probe_large,
        probe_after_ingest,
        on_the_way,
        memory_before,
        memory_after,
        rss_small,
        rss_large,
        rss_after_ingest,
        fill_per_sec,
        fill_cpu,
    })
}

/// The powers of ten strictly between `small` and `large`.
fn decades(small: usize, large: usize) -> Vec<usize> {
    std::iter::successors(Some(10usize), |p| p.checked_mul(10))
        .skip_while(|p| *p <= small)
        .take_while(|p| *p < large)
        .collect()
}

/// Opens groups `small..large` on `t`, stopping at each power of ten on the
/// way to probe it (rounds 'a', 'b', ...). Returns the groups opened per
/// second and the CPU use while opening (probes left out), and the probes.
async fn open_probing(
    t: &Target,
    small: usize,
    large: usize,
    run: &str,
    probes: usize,
) -> Result<(f64, CpuUse, Vec<(usize, Probe)>), String> {
    let (mut from, mut secs, mut cpu) = (small, 0.0, None::<CpuUse>);
    let mut on_the_way = Vec::new();
    for (step, to) in decades(small, large).into_iter().chain([large]).enumerate() {
        let (s, c) = open_groups(t, from..to, run, 16).await?;
        secs += s;
        cpu = Some(match cpu {
            Some(before) => before.merge(c),
            None => c,
        });
        if to < large {
            let round = char::from(b'a' + step as u8);
            on_the_way.push((to, probe(t, run, round, probes).await?));
        }
        from = to;
    }
    let cpu = cpu.ok_or("no groups to open")?;
    Ok(((large - small) as f64 / secs.max(1e-9), cpu, on_the_way))
}

/// Opens one one-item group for each index in `range` (keys `sc-<run><index>`),
/// with AddMany calls of 100 from `concurrency` callers. Returns the seconds
/// it took and the CPU use meanwhile.
async fn open_groups(
    t: &Target,
    range: std::ops::Range<usize>,
    run: &str,
    concurrency: usize,
) -> Result<(f64, CpuUse), String> {
    let clients = connect_many(t.addr, 4).await?;
    let wanted = range.len();
    let keys = Arc::new(range.map(|i| key("sc", run, i as u64)).collect::<Vec<_>>());
    let cpu = t.cpu_meter();
    let started = Instant::now();
    let opened = fill(&clients, keys, run, concurrency).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu.finish();
    if opened as usize != wanted {
        return Err(format!("opened {opened} groups, expected {wanted}"));
    }
    Ok((secs, cpu))
}

/// Measures Add latency without changing the number of open groups: each of
/// 4 probers adds one item under a fresh key (opening a group, the add path
/// that touches the most: the due set as well as the group hash), records the
/// latency, then removes the item, which deletes the group again. The first
/// tenth of each prober's adds warm up and are not recorded. `round` keeps the
/// keys of successive probes apart.
async fn probe_latency(
    t: &Target,
    run: &str,
    round: char,
    total: usize,
) -> Result<Histogram<u64>, String> {
    const PROBERS: usize = 4;
    let clients = connect_many(t.addr, PROBERS).await?;
    let per_prober = (total / PROBERS) as u64;
    let warmup = per_prober / 10;
    let mut tasks = JoinSet::new();
    for (prober, mut client) in clients.into_iter().enumerate() {
        let run = run.to_string();
        tasks.spawn(async move {
            let mut latency = histogram();
            for seq in 0..warmup + per_prober {
                let key = format!("sc-{run}{round}{prober}{seq:06}");
                let item_id = id(&run, prober, seq);
                let began = Instant::now();
                let response = client
                    .add(add_request(key.clone(), item_id.clone()))
                    .await
                    .map_err(|s| format!("Add: {}", s.message()))?
                    .into_inner();
                if seq >= warmup {
                    record(&mut latency, began.elapsed().as_micros() as u64);
                }
                if response.outcome != pb::AddOutcome::Added as i32 {
                    return Err(format!("probe add of {key} was not ADDED"));
                }
                let removed = client
                    .remove(pb::RemoveRequest { key, item_id })
                    .await
                    .map_err(|s| format!("Remove: {}", s.message()))?
                    .into_inner();
                if !removed.removed {
                    return Err("probe remove found nothing to remove".into());
                }
            }
            Ok::<_, String>(latency)
        });
    }
    let mut latency = histogram();
    while let Some(joined) = tasks.join_next().await {
        latency
            .add(&joined.map_err(|e| e.to_string())??)
            .map_err(|e| e.to_string())?;
    }
    Ok(latency)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probes on the way stop at each power of ten between the sizes.
    #[test]
    fn decades_lie_strictly_between() {
        assert_eq!(decades(1_000, 1_000_000), vec![10_000, 100_000]);
        assert_eq!(decades(1_000, 20_000), vec![10_000]);
        assert!(decades(1_000, 10_000).is_empty());
    }
}
