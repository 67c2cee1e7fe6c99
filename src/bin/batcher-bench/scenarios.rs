//! The service scenarios. Each takes a [`Target`] (a fresh service, and an
//! emptied Redis when the bench owns it) and returns what it measured; the
//! bin's module doc says how each figure is computed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batcher::pb;
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::load::{
    Done, LoadStats, Rng, add_request, added, closed_loop, connect, connect_many, fill, histogram,
    id, key, now_micros, record, ts_micros,
};
use super::procs::{CpuMeter, rss_kib};

/// The service and Redis a scenario runs against.
pub struct Target {
    pub addr: SocketAddr,
    /// Known when the bench started the service.
    pub service_pid: Option<u32>,
    /// Known when the bench started Redis.
    pub redis_pid: Option<u32>,
    pub redis_url: String,
}

impl Target {
    fn processes(&self) -> [(&'static str, Option<u32>); 3] {
        [
            ("redis", self.redis_pid),
            ("service", self.service_pid),
            ("bench", Some(std::process::id())),
        ]
    }

    /// Starts measuring CPU use of Redis, the service and the bench.
    fn cpu_meter(&self) -> CpuMeter {
        CpuMeter::start(&self.processes())
    }

    /// Measures CPU use over the window that starts after `warmup` and lasts `window`.
    fn cpu_during(&self, warmup: Duration, window: Duration) -> JoinHandle<String> {
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
            probes: if quick { 4_000 } else { 20_000 },
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

/// Throughput of an ingest scenario.
pub struct Ingest {
    pub stats: LoadStats,
    pub cpu: String,
}

/// Keys the ingest scenarios spread their items over.
const INGEST_KEYS: u64 = 10_000;

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

/// Timeout lateness of every group of scenario 3.
pub struct Precision {
    pub groups: usize,
    /// Lateness in µs (whole milliseconds: Redis timestamps are in ms).
    pub lateness: Histogram<u64>,
    pub received: usize,
    pub missed: usize,
    /// Batches beyond the first for one group; there should be none.
    pub duplicates: usize,
    /// Batches flushed before their due time, or not by TIMEOUT; none expected.
    pub anomalies: usize,
    pub open_secs: f64,
    pub open_errors: String,
    pub cpu: String,
}

/// Scenario 3: opens `precision_groups` one-item groups within one step,
/// spread over the wait globs, and measures when each one flushes.
pub async fn timeout_precision(t: &Target, s: &Sizes, run: &str) -> Result<Precision, String> {
    let waits = &s.precision_waits;
    let step = waits[0];
    let max_wait = *waits.last().expect("at least one wait");
    let n = s.precision_groups;
    let prefix = "tp-".to_string();
    let group_key = |i: usize| {
        let wait = waits[i % waits.len()].as_millis();
        format!("tp-{wait}-{run}{i:08}")
    };

    // Subscribe before opening anything, so no batch is missed.
    let mut subscriber = connect(t.addr).await?;
    let mut stream = subscriber
        .subscribe(pb::SubscribeRequest {
            keys: Vec::new(),
            key_prefixes: vec![prefix],
            after: String::new(),
            ..Default::default()
        })
        .await
        .map_err(|s| format!("Subscribe: {}", s.message()))?
        .into_inner();
    let stop = CancellationToken::new();
    let run_len = run.len();
    let collector = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut seen = vec![false; n];
            let (mut received, mut duplicates, mut anomalies) = (0, 0, 0);
            let mut lateness = histogram();
            while received < n {
                let batch = tokio::select! {
                    _ = stop.cancelled() => break,
                    message = stream.message() => match message {
                        Ok(Some(batch)) => batch,
                        Ok(None) => break,
                        Err(status) => return Err(format!("Subscribe stream: {}", status.message())),
                    },
                };
                // Keys are tp-<wait ms>-<run><index>.
                let parsed = batch.key.strip_prefix("tp-").and_then(|rest| {
                    let (wait, tail) = rest.split_once('-')?;
                    Some((
                        wait.parse::<u64>().ok()?,
                        tail.get(run_len..)?.parse::<usize>().ok()?,
                    ))
                });
                let Some((wait_ms, index)) = parsed.filter(|(_, i)| *i < n) else {
                    continue;
                };
                if std::mem::replace(&mut seen[index], true) {
                    duplicates += 1;
                    continue;
                }
                received += 1;
                let opened = ts_micros(batch.opened_at.as_ref()) / 1000;
                let flushed = ts_micros(batch.flushed_at.as_ref()) / 1000;
                let late_ms = flushed as i64 - (opened + wait_ms) as i64;
                if late_ms < 0 || batch.reason != pb::FlushReason::Timeout as i32 {
                    anomalies += 1;
                }
                record(&mut lateness, late_ms.max(0) as u64 * 1000);
            }
            Ok((lateness, received, duplicates, anomalies))
        })
    };

    // Open the groups evenly over one step, in AddMany calls of 100.
    let clients = connect_many(t.addr, 4).await?;
    let cpu = t.cpu_meter();
    let chunks = n.div_ceil(100);
    let interval = step / chunks as u32;
    let limit = Arc::new(Semaphore::new(32));
    let started = Instant::now();
    let mut opens = JoinSet::new();
    for chunk in 0..chunks {
        tokio::time::sleep_until((started + interval * chunk as u32).into()).await;
        let permit = limit
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = clients[chunk % clients.len()].clone();
        let items = (chunk * 100..(chunk * 100 + 100).min(n))
            .map(|i| add_request(group_key(i), id(run, 0, i as u64)))
            .collect();
        opens.spawn(async move {
            let result = client.add_many(pb::AddManyRequest { items }).await;
            drop(permit);
            result.map(|r| added(&r.into_inner().results))
        });
    }
    let (mut opened, mut errors, mut first_error) = (0, 0, None);
    while let Some(joined) = opens.join_next().await {
        match joined.map_err(|e| e.to_string())? {
            Ok(count) => opened += count,
            Err(status) => {
                errors += 1;
                first_error.get_or_insert(status.message().to_string());
            }
        }
    }
    let open_secs = started.elapsed().as_secs_f64();
    let mut open_errors = String::new();
    if opened as usize != n {
        open_errors = format!(
            "; only {opened} of {n} groups opened ({errors} failed calls, first: {})",
            first_error.unwrap_or_default()
        );
    }

    // Wait for the last due time, plus a grace period for stragglers.
    let deadline = Instant::now() + max_wait + Duration::from_secs(5);
    let mut collector = collector;
    let collected = match tokio::time::timeout_at(deadline.into(), &mut collector).await {
        Ok(joined) => joined,
        Err(_) => {
            stop.cancel();
            collector.await
        }
    };
    let (lateness, received, duplicates, anomalies) =
        collected.map_err(|e| format!("collector failed: {e}"))??;
    let cpu = cpu.finish();
    Ok(Precision {
        groups: n,
        lateness,
        received,
        missed: n - received,
        duplicates,
        anomalies,
        open_secs,
        open_errors,
        cpu,
    })
}

/// Flush-to-subscriber latency of scenario 4.
pub struct Fanout {
    pub subscribers: usize,
    pub batches: u64,
    /// Receive time minus flushed_at, µs.
    pub latency: Histogram<u64>,
    pub delivered: u64,
    pub rss_max_kib: Option<u64>,
    pub errors: String,
    pub cpu: String,
}

/// Scenario 4: 100 subscribers, each on its own connection, while groups of
/// 10 items are completed at 100 per second (each AddMany of 10 items to a
/// fresh key flushes one batch by SIZE).
pub async fn fanout(t: &Target, s: &Sizes, run: &str) -> Result<Fanout, String> {
    const SUBSCRIBERS: usize = 100;
    const PER_SEC: u64 = 100;
    const ITEMS: u64 = 10;
    let batches = PER_SEC * s.fanout_window.as_secs();
    let prefix = format!("fs-{run}");
    let stop = CancellationToken::new();
    let mut receivers = JoinSet::new();
    for _ in 0..SUBSCRIBERS {
        let mut client = connect(t.addr).await?;
        let mut stream = client
            .subscribe(pb::SubscribeRequest {
                keys: Vec::new(),
                key_prefixes: vec![prefix.clone()],
                after: String::new(),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("Subscribe: {}", s.message()))?
            .into_inner();
        let stop = stop.clone();
        receivers.spawn(async move {
            let _client = client;
            let mut latency = histogram();
            let mut count = 0;
            while count < batches {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    message = stream.message() => match message {
                        Ok(Some(batch)) => {
                            let flushed = ts_micros(batch.flushed_at.as_ref());
                            record(&mut latency, now_micros().saturating_sub(flushed));
                            count += 1;
                        }
                        Ok(None) => break,
                        Err(status) => return Err(format!("Subscribe stream: {}", status.message())),
                    },
                }
            }
            Ok::<_, String>((latency, count))
        });
    }

    // Sample the service's RSS while it streams.
    let sampler = {
        let (pid, stop) = (t.service_pid, stop.clone());
        tokio::spawn(async move {
            let mut max = None;
            while !stop.is_cancelled() {
                if let Some(rss) = pid.and_then(rss_kib) {
                    max = Some(max.unwrap_or(0).max(rss));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            max
        })
    };

    let clients = connect_many(t.addr, 2).await?;
    let cpu = t.cpu_meter();
    let started = Instant::now();
    let mut adds = JoinSet::new();
    for b in 0..batches {
        let at = started + Duration::from_secs(1) * b as u32 / PER_SEC as u32;
        tokio::time::sleep_until(at.into()).await;
        let mut client = clients[b as usize % clients.len()].clone();
        let group = key("fs", run, b);
        let items = (0..ITEMS)
            .map(|i| add_request(group.clone(), id(run, 0, i)))
            .collect();
        adds.spawn(async move { client.add_many(pb::AddManyRequest { items }).await });
    }
    let (mut errors, mut first_error) = (0, None);
    while let Some(joined) = adds.join_next().await {
        if let Err(status) = joined.map_err(|e| e.to_string())? {
            errors += 1;
            first_error.get_or_insert(status.message().to_string());
        }
    }
    // Give the last batches time to arrive, then stop whatever is still waiting.
    let mut results = Vec::new();
    let all = async {
        while let Some(joined) = receivers.join_next().await {
            results.push(joined);
        }
    };
    if tokio::time::timeout(Duration::from_secs(3), all)
        .await
        .is_err()
    {
        stop.cancel();
        while let Some(joined) = receivers.join_next().await {
            results.push(joined);
        }
    }
    let mut latency = histogram();
    let mut delivered = 0;
    stop.cancel();
    for result in results {
        let (h, count) = result.map_err(|e| e.to_string())??;
        latency.add(&h).map_err(|e| e.to_string())?;
        delivered += count;
    }
    let cpu = cpu.finish();
    let rss_max_kib = sampler.await.unwrap_or(None);
    let errors = if errors > 0 {
        format!(
            "; {errors} failed AddMany calls (first: {})",
            first_error.unwrap_or_default()
        )
    } else {
        String::new()
    };
    Ok(Fanout {
        subscribers: SUBSCRIBERS,
        batches,
        latency,
        delivered,
        rss_max_kib,
        errors,
        cpu,
    })
}

/// Opens one one-item group for each index in `range` (keys `sc-<run><index>`),
/// with AddMany calls of 100 from `concurrency` callers. Returns the groups
/// opened per second and the CPU use meanwhile.
pub async fn open_groups(
    t: &Target,
    range: std::ops::Range<usize>,
    run: &str,
    concurrency: usize,
) -> Result<(f64, String), String> {
    let clients = connect_many(t.addr, 4).await?;
    let wanted = range.len();
    let keys = Arc::new(range.map(|i| key("sc", run, i as u64)).collect::<Vec<_>>());
    let cpu = t.cpu_meter();
    let started = Instant::now();
    let opened = fill(&clients, keys, run, concurrency).await?;
    let per_sec = opened as f64 / started.elapsed().as_secs_f64();
    let cpu = cpu.finish();
    if opened as usize != wanted {
        return Err(format!("opened {opened} groups, expected {wanted}"));
    }
    Ok((per_sec, cpu))
}

/// Measures Add latency without changing the number of open groups: each of
/// 4 probers adds one item under a fresh key (opening a group, the add path
/// that touches the most: the due set as well as the group hash), records the
/// latency, then removes the item, which deletes the group again. The first
/// tenth of each prober's adds warm up and are not recorded. `round` keeps the
/// keys of successive probes apart.
pub async fn probe(
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

/// Redis's `used_memory` (bytes), from INFO memory.
pub async fn used_memory(url: &str) -> Result<u64, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO memory: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".to_string())
}

/// Calls and total microseconds of EVALSHA so far, from INFO commandstats.
pub async fn script_stats(url: &str) -> Result<(u64, u64), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let Some(line) = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
    else {
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
