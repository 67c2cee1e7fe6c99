//! The Python client in `examples/python` against a real service, in a
//! virtualenv the tests create: the producer's parcels reach the durable
//! consumer exactly once and are acked, also when the producer repeats its
//! adds, and when both scripts start before the service and outlive a
//! restart of it.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;

use redis::streams::StreamPendingCountReply;
use support::python::{Python, Script};
use support::{RedisServer, Service, all_batches, config, eventually, free_addr, placements};

/// Ten parcels a truck, and no flush by time or redelivery by ack timeout
/// within a test: every batch is SIZE or CLOSED, and delivered once.
const POLICY: &str = "[defaults]\nmax_items = 10\nmax_wait = \"10m\"\n\
                      [subscriptions]\nack_timeout = \"1h\"\n";

const GROUP: &str = "loaders";

/// The ids the producer gives `count` parcels with `prefix`.
fn parcel_ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}{n:05}")).collect()
}

/// Starts consumer.py in group GROUP, printing JSON, until it has `items`.
fn consumer(python: &Python, addr: SocketAddr, items: usize) -> Script {
    let (addr, items) = (addr.to_string(), items.to_string());
    let args = [
        "--addr", &addr, "--group", GROUP, "--consumer", "c1", "--from-start", "--json",
        "--max-items", &items,
    ];
    python.spawn("consumer", "consumer.py", &args)
}

/// Starts producer.py: `count` parcels `<prefix>NNNNN` under "north", ten
/// per AddMany, the last one closing its group.
fn producer(python: &Python, addr: SocketAddr, prefix: &str, count: usize) -> Script {
    let (addr, count) = (addr.to_string(), count.to_string());
    let args = [
        "--addr", &addr, "--key", "north", "--prefix", prefix, "--count", &count,
        "--batch-size", "10", "--close",
    ];
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
        ids.extend(items.iter().map(|i| i["id"].as_str().expect("id").to_owned()));
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
async fn assert_exactly_once(seen: &[String], expected: &[String], config: &batcher::config::Config) {
    let mut seen_sorted = seen.to_vec();
    seen_sorted.sort();
    let mut expected_sorted = expected.to_vec();
    expected_sorted.sort();
    assert_eq!(seen_sorted, expected_sorted, "the consumer's items");
    let stored = placements(&all_batches(&support::store(config)).await);
    let want: HashMap<_, _> = expected
        .iter()
        .map(|id| (("north".to_owned(), id.clone()), 1))
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

    let first = producer(&python, service.addr, "parcel-", 25).success().await;
    assert_eq!(first.trim(), "added 25, duplicates 0, key north");
    let again = producer(&python, service.addr, "parcel-", 25).success().await;
    assert_eq!(again.trim(), "added 0, duplicates 25, key north");

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
    let addr = free_addr();
    let consumer = consumer(&python, addr, 40);
    let early = producer(&python, addr, "a-", 20);
    eventually("both scripts to retry while the service is down", || {
        let retried = early.stderr().contains("with the same ids")
            && consumer.stderr().contains("reconnecting");
        async move { retried.then_some(()) }
    })
    .await;

    let first = start_at(addr, &config).await;
    assert_eq!(early.success().await.trim(), "added 20, duplicates 0, key north");
    eventually("the consumer to process and ack the first 20", || {
        let done = delivered(&consumer.stdout()).len() == 20 && pending(&redis) == 0;
        async move { done.then_some(()) }
    })
    .await;
    let reconnects = consumer.stderr().matches("reconnecting").count();
    first.stop().await;
    eventually("the consumer to notice the stop", || {
        let noticed = consumer.stderr().matches("reconnecting").count() > reconnects;
        async move { noticed.then_some(()) }
    })
    .await;

    let second = start_at(addr, &config).await;
    let late = producer(&python, addr, "b-", 20).success().await;
    assert_eq!(late.trim(), "added 20, duplicates 0, key north");
    let seen = delivered(&consumer.success().await);
    let expected = [parcel_ids("a-", 20), parcel_ids("b-", 20)].concat();
    assert_exactly_once(&seen, &expected, &config).await;
    assert_eq!(pending(&redis), 0, "the consumer acked every batch");
    second.stop().await;
}

/// A service on `addr`, where the scripts already point.
async fn start_at(addr: SocketAddr, config: &batcher::config::Config) -> Service {
    let listener = tokio::net::TcpListener::bind(addr).await;
    let listener = listener.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    Service::start_on(listener, config.clone()).await
}
