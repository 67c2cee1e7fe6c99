//! The routes of our shapes and the peer's (see
//! [`Route`](super::shapes::Route)): `Store::add`, with the plain policy or
//! with every rule on, and BullMQ; each on a profiled Redis, one call at a
//! time, counting only the calls after a warm-up. The floors' route is in
//! [`floors`](super::floors).

use std::collections::BTreeMap;
use std::time::Duration;

use batcher::batch::Item;
use batcher::batch::{AddOutcome, AddResult};
use batcher::keys::Keyspace;
use batcher::store::{NewItem, RedisTarget, Store, Timeouts};
use redis::aio::MultiplexedConnection;

use super::Measured;
use super::profiled::{Profiled, connection};
use super::shapes::{Draw, Policies, Shape, group_key, sequence};
use crate::load::{self, PAYLOAD};

pub(super) async fn flushall(conn: &mut MultiplexedConnection) -> Result<(), String> {
    redis::cmd("FLUSHALL")
        .query_async::<()>(conn)
        .await
        .map_err(|e| format!("FLUSHALL: {e}"))
}

/// The keyspace of a shape of `shards` shards: one for all but `rounds`,
/// `sharded` and `floor_rounds`, so that one `Store::add` is one script call.
pub(super) fn keyspace(shards: u16) -> Keyspace {
    Keyspace::new("ins", shards)
}

/// Milliseconds since the Unix epoch, on the host clock.
pub(super) fn now_ms() -> u64 {
    load::now_micros() / 1000
}

/// A store on the profiled Redis, under the shapes' policies.
fn open_store(redis: &Profiled, policies: &Policies, shards: u16) -> Result<Store, String> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(30),
        response: Duration::from_secs(300),
    };
    Store::open(
        &RedisTarget::single(redis.url(), timeouts),
        keyspace(shards),
        policies.dedup,
        policies.handle.clone(),
    )
    .map_err(|e| format!("Store::open: {e}"))
}

/// Counts the added items of `results` (returned) and their batches by
/// reason (into `batches`).
fn tally(results: &[AddResult], batches: &mut BTreeMap<String, u64>) -> usize {
    let mut added = 0;
    for result in results {
        added += usize::from(result.outcome == AddOutcome::Added);
        for batch in &result.flushed {
            *batches
                .entry(batch.reason.as_str().to_string())
                .or_default() += 1;
        }
    }
    added
}

/// A shape through `Store::add`, one call at a time.
pub(super) async fn run_store(
    redis: &mut Profiled,
    shape: &Shape,
    rules: bool,
    policies: &Policies,
) -> Result<Measured, String> {
    let store = open_store(redis, policies, shape.shards)?;
    let policy = if rules {
        &policies.rules
    } else {
        &policies.plain
    };
    let new_item = |draw: &Draw, now: u64| {
        let mut item = Item::new(draw.id.as_bytes(), PAYLOAD.to_vec());
        if rules {
            item.measures.insert("weight_g".into(), draw.weight_g);
            item.measures.insert("volume_cm3".into(), draw.volume_cm3);
            item.deadline_ms = draw.deadline_s.map(|s| now + s * 1000);
        }
        NewItem {
            key: group_key(rules, draw.key),
            item,
            policy: policy.clone(),
            close: false,
            requeue_of: None,
        }
    };
    // Warm-up: loads whatever the store runs, then leaves Redis empty.
    let mut conn = connection(redis.url()).await?;
    let warm = NewItem {
        key: "warm-up".into(),
        ..new_item(&sequence(1)[0], now_ms())
    };
    store
        .add(vec![warm])
        .await
        .map_err(|e| format!("warm-up add: {e}"))?;
    flushall(&mut conn).await?;
    redis.dump().await?;

    let draws = sequence(shape.items);
    let mut calls = 0;
    let mut added = 0;
    let mut batches = BTreeMap::new();
    for chunk in draws.chunks(shape.per_call) {
        let now = now_ms();
        let items = chunk.iter().map(|draw| new_item(draw, now)).collect();
        let report = store
            .add(items)
            .await
            .map_err(|e| format!("{}: add: {e}", shape.name))?;
        calls += 1;
        added += tally(&report.results, &mut batches);
    }
    let instructions = redis.dump().await?;
    Measured::of_shape(shape, "the store", added, calls, instructions, batches)
}

/// A peer shape: BullMQ adding `shape.items` jobs, one call at a time, by
/// `bench/peer/bullmq.mjs --count` against the profiled Redis. Counted from
/// the script's `ready` (BullMQ's scripts loaded, one job added) to its exit.
pub(super) async fn run_peer(
    redis: &mut Profiled,
    shape: &Shape,
    bulk: bool,
) -> Result<Measured, String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let peer = crate::repo_root().join("bench/peer");
    if !peer.join("node_modules/bullmq").exists() {
        return Err(format!(
            "{}: BullMQ is not installed in {}: run `npm ci` there (or bench/peer/run once)",
            shape.name,
            peer.display()
        ));
    }
    let port = redis
        .url()
        .rsplit(':')
        .next()
        .ok_or_else(|| format!("no port in {}", redis.url()))?
        .to_string();
    let mut child = tokio::process::Command::new("node")
        .arg(peer.join("bullmq.mjs"))
        .args(["--redis-port", &port, "--count", &shape.items.to_string()])
        .args(["--mode", if bulk { "addBulk" } else { "add" }])
        .args(["--bulk", &shape.per_call.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: cannot run node (scripts/ensure-node): {e}", shape.name))?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let name = shape.name;
    async fn line(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        name: &str,
    ) -> Result<String, String> {
        lines
            .next_line()
            .await
            .map_err(|e| format!("{name}: reading bullmq.mjs: {e}"))?
            .ok_or_else(|| format!("{name}: bullmq.mjs ended early"))
    }
    let ready = line(&mut lines, name).await?;
    if ready != "ready" {
        return Err(format!("{}: bullmq.mjs said {ready:?}", shape.name));
    }
    redis.dump().await?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(b"go\n")
        .await
        .map_err(|e| format!("{}: writing to bullmq.mjs: {e}", shape.name))?;
    let done: serde_json::Value = serde_json::from_str(&line(&mut lines, name).await?)
        .map_err(|e| format!("{}: bullmq.mjs's report: {e}", shape.name))?;
    let status = child
        .wait()
        .await
        .map_err(|e| format!("{}: waiting for node: {e}", shape.name))?;
    let instructions = redis.dump().await?;
    let jobs = done["jobs"].as_u64().unwrap_or(0) as usize;
    if !status.success() || jobs != shape.items {
        return Err(format!(
            "{}: bullmq.mjs added {jobs} of {} jobs ({status})",
            shape.name, shape.items
        ));
    }
    Ok(Measured {
        name: shape.name,
        checked: false,
        items: jobs,
        calls: done["calls"].as_u64().unwrap_or(0) as usize,
        instructions,
        batches: BTreeMap::new(),
        spread: None,
    })
}
