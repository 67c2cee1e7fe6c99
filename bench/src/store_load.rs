//! The hidden `__store_load` subcommand: batcher's add path without the
//! service, driven as `bench/peer/floor.mjs` drives the frozen floors, so
//! that a sitting can set our add beside a floor with nothing else
//! different: no gRPC, no service process beside Redis, the same callers,
//! calls, keys, ids and payloads.
//!
//! 16 callers each loop a `Store::add` of 100 items, all of one shard
//! drawn at random of 16 (`--spread shard`, as floor.mjs's calls) or each
//! of its own shard (`--spread all`, as scenario 1's AddMany): each item's
//! key at random of 10k 15-byte keys (of the shard's share of them), a
//! fresh 25-byte id and a 32-byte payload; groups flush at 10 items, due
//! after an hour, with the service's default dedup window. The store's own
//! writers merge what queued, as in the service. Redis's CPU is read at
//! the window's edges (`/proc/PID/stat`). Prints one line of JSON.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use batcher::batch::{AddOutcome, Item};
use batcher::config::Config;
use batcher::keys::Keyspace;
use batcher::policy::PolicyHandle;
use batcher::store::{NewItem, RedisTarget, Store, Timeouts};

use crate::load::{Done, PAYLOAD, Rng, closed_loop, id};
use crate::procs::CpuMeter;

const CALLERS: usize = 16;
const PER_CALL: u64 = 100;
const KEYS: u64 = 10_000;
/// The shards of scenario 1's service, which `--spread all` mirrors.
const SHARDS: u16 = crate::service::SHARDS;

/// Which shards a call's items are of.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Spread {
    /// One shard, drawn per call (floor.mjs's calls).
    Shard,
    /// Every shard (scenario 1's AddMany).
    All,
}

/// Its flags.
#[derive(clap::Args)]
pub struct Opts {
    #[arg(long)]
    redis_port: u16,
    #[arg(long)]
    redis_pid: u32,
    #[arg(long, value_enum, default_value_t = Spread::Shard)]
    spread: Spread,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    warmup: u64,
}

pub async fn run(opts: Opts) -> Result<String, String> {
    let one_shard = matches!(opts.spread, Spread::Shard);
    let config = Config::parse(
        "[defaults]\nmax_items = 10\nmax_wait = \"1h\"\n",
        "store_load",
    )
    .map_err(|e| e.to_string())?;
    let table = config.policies();
    let policy = table.resolve("sl");
    let keyspace = Keyspace::new("bench", SHARDS);
    // A run's own 4 characters, so runs may share a Redis (as floor.mjs's).
    let run = format!("{:04}", std::process::id() % 10_000);
    let mut by_shard = vec![Vec::new(); usize::from(SHARDS)];
    for n in 0..KEYS {
        let key = format!("sl-{run}{n:08}");
        by_shard[usize::from(keyspace.shard_of(&key))].push(key);
    }
    let all: Vec<String> = by_shard.iter().flatten().cloned().collect();
    let url = format!("redis://127.0.0.1:{}", opts.redis_port);
    let timeouts = Timeouts {
        connect: Duration::from_secs(10),
        response: Duration::from_secs(60),
    };
    let store = Store::open(
        &RedisTarget::single(&url, timeouts),
        keyspace,
        config.dedup.window,
        PolicyHandle::new(table),
    )
    .map_err(|e| format!("Store::open: {e}"))?
    // The service's queue limit is for its clients; here every caller
    // waits for its own call, so nothing is refused.
    .with_max_queued_adds(NonZeroUsize::new(1 << 20).expect("nonzero"));
    let (store, by_shard, all) = (Arc::new(store), Arc::new(by_shard), Arc::new(all));
    let (warmup, window) = (
        Duration::from_secs(opts.warmup),
        Duration::from_secs(opts.seconds),
    );
    let pid = opts.redis_pid;
    let cpu = tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        let meter = CpuMeter::start(&[("redis", Some(pid))]);
        tokio::time::sleep(window).await;
        meter.finish()
    });
    let stats = closed_loop(CALLERS, warmup, window, move |caller, seq| {
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let keys = if one_shard {
            &by_shard[rng.below(u64::from(SHARDS)) as usize]
        } else {
            &*all
        };
        let items = (0..PER_CALL)
            .map(|i| NewItem {
                key: keys[rng.below(keys.len() as u64) as usize].clone(),
                item: Item::new(
                    id(&run, caller, seq * PER_CALL + i).as_bytes(),
                    PAYLOAD.to_vec(),
                ),
                policy: policy.clone(),
                close: false,
                requeue_of: None,
            })
            .collect();
        let store = store.clone();
        async move {
            let report = store.add(items).await.map_err(|e| e.to_string())?;
            let added = report
                .results
                .iter()
                .filter(|r| r.outcome == AddOutcome::Added)
                .count() as u64;
            Ok(Done {
                added,
                duplicates: report.results.len() as u64 - added,
            })
        }
    })
    .await?;
    let cpu = cpu.await.map_err(|e| e.to_string())?;
    if stats.errors > 0 || stats.duplicates > 0 {
        return Err(format!("the load was not clean{}", stats.error_note()));
    }
    let redis_s = cpu
        .seconds("redis")
        .ok_or("redis-server's CPU could not be read")?;
    Ok(serde_json::json!({
        "store": "batcher",
        "spread": if one_shard { "shard" } else { "all" },
        "callers": CALLERS,
        "bulk": PER_CALL,
        "seconds": opts.seconds,
        "items": stats.added,
        "rate": stats.per_sec().round() as u64,
        "redis_cpu_us_per_item": (redis_s * 1e6 / stats.added.max(1) as f64 * 100.0).round() / 100.0,
    })
    .to_string())
}
