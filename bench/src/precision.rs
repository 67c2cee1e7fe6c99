//! Scenario 3, timeout precision: one-item groups opened evenly within one
//! step under key globs with different waits, so their due times spread
//! evenly; a subscriber records how late each one flushes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use batcher::pb;
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::load::{
    add_request, added, connect, connect_many, histogram, id, record, subscribe, ts_micros,
};
use super::procs::CpuUse;
use super::scenarios::{Sizes, Target};

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
    pub cpu: CpuUse,
}

/// What the subscriber received.
struct Collected {
    lateness: Histogram<u64>,
    received: usize,
    duplicates: usize,
    anomalies: usize,
}

/// How the groups were opened.
struct Opened {
    secs: f64,
    errors: String,
}

/// Group i's key: `tp-<wait ms>-<run><i>`, the wait being waits[i mod K].
fn group_key(waits: &[Duration], run: &str, i: usize) -> String {
    let wait = waits[i % waits.len()].as_millis();
    format!("tp-{wait}-{run}{i:08}")
}

/// Scenario 3: opens `precision_groups` one-item groups within one step,
/// spread over the wait globs, and measures when each one flushes.
pub async fn timeout_precision(t: &Target, s: &Sizes, run: &str) -> Result<Precision, String> {
    let max_wait = *s.precision_waits.last().expect("at least one wait");
    let n = s.precision_groups;
    // Subscribe before opening anything, so no batch is missed.
    let mut subscriber = connect(t.addr).await?;
    let stream = subscribe(&mut subscriber, "tp-").await?;
    let stop = CancellationToken::new();
    let mut collector = tokio::spawn(collect(stream, n, run.len(), stop.clone()));

    let cpu = t.cpu_meter();
    let opened = open_spread(t, s, run).await?;

    // Wait for the last due time, plus a grace period for stragglers.
    let deadline = Instant::now() + max_wait + Duration::from_secs(5);
    let collected = match tokio::time::timeout_at(deadline.into(), &mut collector).await {
        Ok(joined) => joined,
        Err(_) => {
            stop.cancel();
            collector.await
        }
    };
    let c = collected.map_err(|e| format!("collector failed: {e}"))??;
    Ok(Precision {
        groups: n,
        lateness: c.lateness,
        received: c.received,
        missed: n - c.received,
        duplicates: c.duplicates,
        anomalies: c.anomalies,
        open_secs: opened.secs,
        open_errors: opened.errors,
        cpu: cpu.finish(),
    })
}

/// Receives batches until every one of the `n` groups has flushed or `stop`
/// is cancelled, recording each group's lateness once.
async fn collect(
    mut stream: tonic::Streaming<pb::Batch>,
    n: usize,
    run_len: usize,
    stop: CancellationToken,
) -> Result<Collected, String> {
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
    Ok(Collected {
        lateness,
        received,
        duplicates,
        anomalies,
    })
}

/// Opens the groups evenly over one step, in AddMany calls of 100.
async fn open_spread(t: &Target, s: &Sizes, run: &str) -> Result<Opened, String> {
    let n = s.precision_groups;
    let clients = connect_many(t.addr, 4).await?;
    let chunks = n.div_ceil(100);
    let interval = s.precision_waits[0] / chunks as u32;
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
            .map(|i| add_request(group_key(&s.precision_waits, run, i), id(run, 0, i as u64)))
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
    let mut note = String::new();
    if opened as usize != n {
        note = format!(
            "; only {opened} of {n} groups opened ({errors} failed calls, first: {})",
            first_error.unwrap_or_default()
        );
    }
    Ok(Opened {
        secs: started.elapsed().as_secs_f64(),
        errors: note,
    })
}
