//! Load-generation building blocks: gRPC clients (the testkit's), a
//! closed-loop driver that counts work completed inside a measurement
//! window, histograms, and the key, id and payload formats every scenario
//! shares.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use batcher::pb;
pub use batcher_testkit::grpc::{Client, connect};
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tonic::Streaming;

/// Every payload: 32 bytes, the size the memory target is stated for.
pub const PAYLOAD: [u8; 32] = [b'p'; 32];

/// Opens `n` connections.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<Client>, String> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(connect(addr).await?);
    }
    Ok(clients)
}

/// A group key: `<scenario>-<run tag><number>`, 15 bytes for the ingest
/// scenarios (two-letter scenario tags). The run tag keeps keys of different
/// runs apart when Redis or the service is not the bench's own.
pub fn key(scenario: &str, run: &str, n: u64) -> String {
    format!("{scenario}-{run}{n:08}")
}

/// An item id: 25 bytes, unique per run, caller and sequence number.
pub fn id(run: &str, caller: usize, seq: u64) -> String {
    format!("{run}{caller:08}-{seq:012}")
}

/// Subscribes `client` to every batch of the keys that start with `prefix`.
pub async fn subscribe(client: &mut Client, prefix: &str) -> Result<Streaming<pb::Batch>, String> {
    let request = pb::SubscribeRequest {
        key_prefixes: vec![prefix.to_string()],
        ..Default::default()
    };
    Ok(client
        .subscribe(request)
        .await
        .map_err(|s| format!("Subscribe: {}", s.message()))?
        .into_inner())
}

/// One add request with the standard payload.
pub fn add_request(key: String, id: String) -> pb::AddRequest {
    pb::AddRequest {
        key,
        item: Some(pb::Item {
            id,
            payload: PAYLOAD.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Counts the ADDED outcomes of an AddMany response.
pub fn added(results: &[pb::AddResponse]) -> u64 {
    results
        .iter()
        .filter(|r| r.outcome == pb::AddOutcome::Added as i32)
        .count() as u64
}

/// xorshift64*: enough randomness to spread keys, with no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// A latency histogram in microseconds (1 µs to 1 h, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// Records a duration in microseconds (saturating into the histogram's range).
pub fn record(h: &mut Histogram<u64>, micros: u64) {
    h.saturating_record(micros.max(1));
}

/// A quantile of a microsecond histogram, in milliseconds.
pub fn ms(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// Host clock, microseconds since the Unix epoch (the clock Redis's TIME reads).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// A protobuf timestamp in microseconds since the Unix epoch.
pub fn ts_micros(ts: Option<&prost_types::Timestamp>) -> u64 {
    ts.map_or(0, |t| t.seconds as u64 * 1_000_000 + t.nanos as u64 / 1000)
}

/// What one operation of a closed-loop caller did.
#[derive(Clone, Copy, Default)]
pub struct Done {
    pub added: u64,
    pub duplicates: u64,
}

/// What a closed-loop run measured inside its window.
pub struct LoadStats {
    /// Items added by operations that completed inside the window.
    pub added: u64,
    pub duplicates: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Latency of each operation that completed inside the window (µs).
    pub latency: Histogram<u64>,
    pub window: Duration,
}

impl LoadStats {
    pub fn per_sec(&self) -> f64 {
        self.added as f64 / self.window.as_secs_f64()
    }

    /// "" or "; 3 errors (first: ...)" for the notes.
    pub fn error_note(&self) -> String {
        let mut note = String::new();
        if self.duplicates > 0 {
            note += &format!("; {} unexpected DUPLICATE outcomes", self.duplicates);
        }
        if self.errors > 0 {
            note += &format!(
                "; {} failed calls (first: {})",
                self.errors,
                self.first_error.as_deref().unwrap_or("?")
            );
        }
        note
    }
}

/// Runs `callers` concurrent loops of `op(caller, seq)` for `warmup` then
/// `window`. Work is counted by completion time: an operation counts if it
/// completes inside the window, so the calls cut at either edge balance out.
/// The loops stop issuing at the end of the window.
pub async fn closed_loop<F, Fut>(
    callers: usize,
    warmup: Duration,
    window: Duration,
    op: F,
) -> Result<LoadStats, String>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Done, String>> + Send + 'static,
{
    let op = Arc::new(op);
    let start = Instant::now() + warmup;
    let end = start + window;
    let mut tasks = JoinSet::new();
    for caller in 0..callers {
        let op = op.clone();
        tasks.spawn(async move {
            let mut stats = LoadStats {
                added: 0,
                duplicates: 0,
                errors: 0,
                first_error: None,
                latency: histogram(),
                window,
            };
            let mut seq = 0;
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let result = op(caller, seq).await;
                seq += 1;
                let done = Instant::now();
                let inside = done >= start && done <= end;
                match result {
                    Ok(d) if inside => {
                        stats.added += d.added;
                        stats.duplicates += d.duplicates;
                        record(&mut stats.latency, (done - began).as_micros() as u64);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        stats.errors += 1;
                        stats.first_error.get_or_insert(e);
                        // Do not spin on a failing service.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            stats
        });
    }
    let mut total: Option<LoadStats> = None;
    while let Some(joined) = tasks.join_next().await {
        let stats = joined.map_err(|e| format!("load task failed: {e}"))?;
        match &mut total {
            None => total = Some(stats),
            Some(t) => {
                t.added += stats.added;
                t.duplicates += stats.duplicates;
                t.errors += stats.errors;
                if t.first_error.is_none() {
                    t.first_error = stats.first_error;
                }
                t.latency.add(&stats.latency).map_err(|e| e.to_string())?;
            }
        }
    }
    total.ok_or_else(|| "no callers".to_string())
}

/// Opens one group (one item) for each of `keys`, with AddMany calls of 100
/// items from `concurrency` callers over `clients`. Returns the items added.
pub async fn fill(
    clients: &[Client],
    keys: Arc<Vec<String>>,
    run: &str,
    concurrency: usize,
) -> Result<u64, String> {
    const CHUNK: usize = 100;
    let next = Arc::new(AtomicU64::new(0));
    let chunks = keys.len().div_ceil(CHUNK) as u64;
    let mut tasks = JoinSet::new();
    for caller in 0..concurrency {
        let mut client = clients[caller % clients.len()].clone();
        let (next, keys, run) = (next.clone(), keys.clone(), run.to_string());
        tasks.spawn(async move {
            let mut added_total = 0;
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                if chunk >= chunks {
                    return Ok::<u64, String>(added_total);
                }
                let from = chunk as usize * CHUNK;
                let items = keys[from..(from + CHUNK).min(keys.len())]
                    .iter()
                    .enumerate()
                    .map(|(i, k)| add_request(k.clone(), id(&run, caller, (from + i) as u64)))
                    .collect();
                let response = client
                    .add_many(pb::AddManyRequest { items })
                    .await
                    .map_err(|s| format!("AddMany: {}", s.message()))?;
                added_total += added(&response.into_inner().results);
            }
        });
    }
    let mut total = 0;
    while let Some(joined) = tasks.join_next().await {
        total += joined.map_err(|e| format!("fill task failed: {e}"))??;
    }
    Ok(total)
}
