//! The Python client in `examples/python` against a real service, in a
//! virtualenv the tests create: the producer's parcels reach the durable
//! consumer exactly once and are acked, also when the producer repeats its
//! adds, and when both scripts start before the service and outlive a
//! restart of it.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::support::python::{Python, Script};
use crate::support::{
    HeldPort, Paused, RedisServer, Service, all_batches, config, eventually, placements,
};
use batcher::config::Config;
use redis::streams::StreamPendingCountReply;

/// Ten parcels a truck, and no flush by time or redelivery by ack timeout
/// within a test: every batch is SIZE or CLOSED, and delivered once.
const POLICY: &str = "[defaults]\nmax_items = 10\nmax_wait = \"10m\"\n\
                      [subscriptions]\nack_timeout = \"1h\"\n";

/// The consumer group of every test.
const GROUP: &str = "loaders";
/// The key every parcel goes under.
const KEY: &str = "north";

/// The ids the producer gives `count` parcels with `prefix`.
fn parcel_ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}{n:05}")).collect()
}

/// Starts consumer.py in group GROUP, printing JSON, until it has `items`.
fn consumer(python: &Python, addr: SocketAddr, items: usize) -> Script {
    let args = format!(
        "--addr {addr} --group {GROUP} --consumer c1 --from-start --json --max-items {items}"
    );
    python.spawn("consumer", "consumer.py", &args)
}

/// Starts producer.py: `count` parcels `<prefix>NNNNN` under KEY, ten
/// per AddMany, the last one closing its group; `extra` arguments after.
fn producer(python: &Python, addr: SocketAddr, prefix: &str, count: usize, extra: &str) -> Script {
    let args = format!(
        "--addr {addr} --key {KEY} --prefix {prefix} --count {count} --batch-size 10 --close {extra}"
    );
    python.spawn(&format!("producer-{prefix}"), "producer.py", &args)
}

/// The item ids of the batches in the consumer's JSON lines, in order;
/// asserts each was a first delivery.
fn delivered(stdout: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for line in stdout.lines() {
        let batch: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(batch["deliveryCount"], 1, "a redelivery: {line}");
        let items = batch["items"].as_array().expect("items");
        ids.extend(
            items
                .iter()
                .map(|i| i["id"].as_str().expect("id").to_owned()),
        );
    }
    ids
}

/// How many batches GROUP holds unacked, over the tests' 4 shards.
fn pending(redis: &RedisServer) -> usize {
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    (0..4)
        .map(|shard| {
            let reply: StreamPendingCountReply = redis::cmd("XPENDING")
                .arg(support::stream_key(shard))
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(100_000)
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("XPENDING in shard {shard}: {e}"));
            reply.ids.len()
        })
        .sum()
}

/// Asserts that `seen` holds each of `expected` once, and that every
/// retained batch over Redis holds them once: no repeat made a new item.
async fn assert_exactly_once(seen: &[String], expected: &[String], config: &Config) {
    let mut seen_sorted = seen.to_vec();
    seen_sorted.sort();
    let mut expected_sorted = expected.to_vec();
    expected_sorted.sort();
    assert_eq!(seen_sorted, expected_sorted, "the consumer's items");
    let stored = placements(&all_batches(&support::store(config)).await);
    let want: HashMap<_, _> = expected
        .iter()
        .map(|id| ((KEY.to_owned(), id.clone()), 1))
        .collect();
    assert_eq!(stored, want, "items in the retained batches");
}

/// The producer's parcels reach the consumer once each, in batches of ten,
/// and are acked; running the producer again adds nothing (all DUPLICATE).
#[tokio::test(flavor = "multi_thread")]
async fn every_parcel_reaches_the_consumer_once_even_when_added_twice() {
    let python = Python::new();
    let redis = RedisServer::start();
    let config = config(&redis.url(), POLICY);
    let service = Service::start(config.clone()).await;
    let consumer = consumer(&python, service.addr, 25);

    let first = producer(&python, service.addr, "parcel-", 25, "")
        .success()
        .await;
    assert_eq!(outcomes(&first), (25, 0), "{first}");
    let again = producer(&python, service.addr, "parcel-", 25, "")
        .success()
        .await;
    assert_eq!(outcomes(&again), (0, 25), "{again}");

    let seen = delivered(&consumer.success().await);
    assert_eq!(seen.len(), 25, "{seen:?}");
    assert_exactly_once(&seen, &parcel_ids("parcel-", 25), &config).await;
    assert_eq!(pending(&redis), 0, "the consumer acked every batch");
    service.stop().await;
}

/// Started before the service, the producer retries UNAVAILABLE with the
/// same ids and the consumer keeps reconnecting; when the service restarts
/// under them, the consumer resubscribes through its group: every parcel of
/// both runs arrives once and is acked.
#[tokio::test(flavor = "multi_thread")]
async fn the_clients_ride_out_a_service_that_is_down_and_restarts() {
    let python = Python::new();
    let redis = RedisServer::start();
    let config = config(&redis.url(), POLICY);
    // Held but not listening: connections are refused, and nothing else
    // can take the port before the service listens on it.
    let reserved = HeldPort::new();
    let addr = reserved.addr;
    let consumer = consumer(&python, addr, 40);
    let early = producer(&python, addr, "a-", 20, "");
    eventually("both scripts to retry while the service is down", || {
        let retried = early.stderr().contains("with the same ids")
            && consumer.stderr().contains("reconnecting");
        async move { retried.then_some(()) }
    })
    .await;

    let first = Service::start_on(reserved.listen(), config.clone()).await;
    let summary = early.success().await;
    assert_eq!(outcomes(&summary), (20, 0), "{summary}");
    eventually("the consumer to process and ack the first 20", || {
        let done = delivered(&consumer.stdout()).len() == 20 && pending(&redis) == 0;
        async move { done.then_some(()) }
    })
    .await;
    let reconnects = consumer.stderr().matches("reconnecting").count();
    let next = HeldPort::at(addr);
    first.stop().await;
    eventually("the consumer to notice the stop", || {
        let noticed = consumer.stderr().matches("reconnecting").count() > reconnects;
        async move { noticed.then_some(()) }
    })
    .await;

    let second = Service::start_on(next.listen(), config.clone()).await;
    let late = producer(&python, addr, "b-", 20, "").success().await;
    assert_eq!(outcomes(&late), (20, 0), "{late}");
    let seen = delivered(&consumer.success().await);
    let expected = [parcel_ids("a-", 20), parcel_ids("b-", 20)].concat();
    assert_exactly_once(&seen, &expected, &config).await;
    assert_eq!(pending(&redis), 0, "the consumer acked every batch");
    second.stop().await;
}

/// While Redis hangs, the producer's calls time out and are repeated with
/// the same ids; whichever of a call and its repeats lands when Redis
/// wakes, each parcel is in one batch, once. (Which one lands first is up
/// to timing, so DUPLICATE answers are counted, not required.)
#[tokio::test(flavor = "multi_thread")]
async fn the_producer_repeats_calls_that_timed_out_against_a_hung_redis() {
    let python = Python::new();
    let redis = RedisServer::start();
    let config = config(&redis.url(), POLICY);
    let service = Service::start(config.clone()).await;
    let consumer = consumer(&python, service.addr, 20);

    let paused = Paused::new(&redis);
    let producer = producer(&python, service.addr, "parcel-", 20, "--timeout 1");
    eventually("the producer to repeat a call", || {
        let retried = producer.stderr().contains("with the same ids");
        async move { retried.then_some(()) }
    })
    .await;
    drop(paused);

    let summary = producer.success().await;
    let (added, duplicates) = outcomes(&summary);
    assert_eq!(added + duplicates, 20, "{summary}");
    let seen = delivered(&consumer.success().await);
    assert_exactly_once(&seen, &parcel_ids("parcel-", 20), &config).await;
    assert_eq!(pending(&redis), 0, "the consumer acked every batch");
    service.stop().await;
}

/// The (added, duplicates) counts of the producer's summary line.
fn outcomes(summary: &str) -> (usize, usize) {
    let counts: Vec<usize> = summary
        .split([' ', ','])
        .filter_map(|word| word.parse().ok())
        .collect();
    match counts[..] {
        [added, duplicates] => (added, duplicates),
        _ => panic!("not a summary: {summary}"),
    }
}
