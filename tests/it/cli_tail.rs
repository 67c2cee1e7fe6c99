//! `batcher tail`, run as the built binary against a real service and a
//! real Redis: one line per batch (text and JSON), Ctrl-C exiting 0, acks
//! through a consumer group (and none with --no-ack), reconnecting after the
//! service restarts without missing or repeating a batch, and dead letters
//! listed and re-driven with the CLI.

use std::net::SocketAddr;

use crate::support::cli::{Tail, at, json_lines, ok};
use crate::support::{HeldPort, RedisServer, Service, config, eventually};
use serde_json::Value;

/// One item per batch, and an ack timeout (and delivery limit) as given.
fn one_per_batch(ack_timeout: &str, max_deliveries: u32) -> String {
    format!(
        "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n[subscriptions]\n\
         ack_timeout = \"{ack_timeout}\"\nmax_deliveries = {max_deliveries}\n"
    )
}

/// An ack timeout no test outlives: nothing is redelivered by timeout.
const PATIENT: &str = "1h";

/// Starts the service on `port`. Nothing waits for its shard tails: a live
/// subscriber that connects at once must still get every batch flushed
/// after it subscribed.
async fn start(redis: &RedisServer, extra: &str, port: HeldPort) -> Service {
    Service::start_on(port.listen(), config(&redis.url(), extra)).await
}

/// Adds item `id` under `key` with the CLI; with max_items = 1 it flushes.
async fn add(addr: SocketAddr, key: &str, id: &str) {
    ok(&at(addr, &["add", key, id]).await);
}

/// The id of the first item of a batch printed as JSON.
fn item(batch: &Value) -> &str {
    batch["items"][0]["id"].as_str().expect("an item id")
}

/// Reads JSON lines until one holds item `id`, and returns those before it.
async fn until(tail: &mut Tail, id: &str) -> Vec<Value> {
    let mut before = Vec::new();
    loop {
        let batch = tail.json().await;
        if item(&batch) == id {
            return before;
        }
        before.push(batch);
    }
}

/// A flushed batch shows as one line (when, key, reason, size, batch id,
/// item ids) and as one JSON object; Ctrl-C ends the tail with status 0.
#[tokio::test]
async fn tail_prints_each_batch() {
    let redis = RedisServer::start();
    let service = start(&redis, "", HeldPort::new()).await;
    let addr = service.addr;
    let mut text = Tail::start(addr, &["--after", "0", "--key", "north-1"]);
    let mut json = Tail::start(addr, &["--after", "0", "--prefix", "north-", "--json"]);
    for id in ["p1", "p2", "p3"] {
        add(addr, "north-1", id).await;
    }
    let flushed = json_lines(&ok(&at(addr, &["flush", "north-1", "--json"]).await));
    let batch_id = flushed[0]["batch"]["id"].as_str().unwrap().to_owned();

    let line = text.line().await;
    let fields = line.split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        fields[1..],
        [
            "north-1", "MANUAL", "3", "items", &batch_id, "p1", "p2", "p3"
        ],
        "{line}"
    );
    assert!(fields[0].parse::<jiff::Timestamp>().is_ok(), "{line}");

    let batch = json.json().await;
    assert_eq!(batch["id"], batch_id.as_str());
    assert_eq!(batch["key"], "north-1");
    assert_eq!(batch["reason"], "FLUSH_REASON_MANUAL");
    let ids = batch["items"].as_array().unwrap().iter().map(|i| &i["id"]);
    assert_eq!(ids.collect::<Vec<_>>(), ["p1", "p2", "p3"]);
    assert!(batch["cursor"].as_str().is_some_and(|c| !c.is_empty()));

    assert_eq!(text.interrupt().await.code(), Some(0));
    assert_eq!(json.interrupt().await.code(), Some(0));
    service.stop().await;
}

/// A tail with --group acks each batch it printed: the same consumer,
/// restarted, gets nothing again. With --no-ack the batches come back.
#[tokio::test]
async fn group_tail_acks_what_it_printed() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &one_per_batch(PATIENT, 100))).await;
    let addr = service.addr;
    let group = ["--json", "--after", "0", "--group", "g", "--consumer", "c"];
    let mut first = Tail::start(addr, &group);
    add(addr, "k", "a").await;
    add(addr, "k", "b").await;
    assert_eq!(item(&first.json().await), "a");
    // The tail acks a before it reads b: once b shows, a is acked.
    assert_eq!(item(&first.json().await), "b");
    first.kill().await;
    let mut second = Tail::start(addr, &group);
    add(addr, "k", "c").await;
    for batch in until(&mut second, "c").await {
        assert_eq!(
            item(&batch),
            "b",
            "only b's ack may have been lost: {batch}"
        );
    }
    second.kill().await;

    let unacked = ["--json", "--after", "0", "--group", "h", "--consumer", "c"];
    let mut third = Tail::start(addr, &[&unacked[..], &["--no-ack"]].concat());
    assert_eq!(item(&third.json().await), "a");
    assert_eq!(item(&third.json().await), "b");
    third.kill().await;
    let mut fourth = Tail::start(addr, &unacked);
    let again = fourth.json().await;
    assert_eq!(
        (item(&again), &again["deliveryCount"]),
        ("a", &Value::from(2))
    );
    fourth.kill().await;
    service.stop().await;
}

/// When the service restarts, a live tail resumes after the last batch it
/// printed (nothing missed, nothing twice) and a group tail resumes through
/// its group.
#[tokio::test]
async fn tail_reconnects_after_a_restart() {
    let redis = RedisServer::start();
    let config = one_per_batch(PATIENT, 100);
    let service = start(&redis, &config, HeldPort::new()).await;
    let addr = service.addr;
    let mut live = Tail::start(addr, &["--json", "--after", "0", "--key", "k"]);
    let group = ["--json", "--after", "0", "--group", "g", "--consumer", "c"];
    let mut durable = Tail::start(addr, &group);
    add(addr, "k", "a").await;
    assert_eq!(item(&live.json().await), "a");
    assert_eq!(item(&durable.json().await), "a");

    let next = HeldPort::at(addr);
    service.stop().await;
    let service = start(&redis, &config, next).await;
    add(addr, "k", "b").await;
    assert_eq!(
        item(&live.json().await),
        "b",
        "resumed after a, nothing twice"
    );
    for batch in until(&mut durable, "b").await {
        assert_eq!(
            item(&batch),
            "a",
            "only a's ack may have been lost: {batch}"
        );
    }
    add(addr, "k", "c").await;
    assert_eq!(item(&live.json().await), "c");
    assert_eq!(item(&durable.json().await), "c");
    assert!(live.stderr().contains("reconnecting"), "{}", live.stderr());
    assert_eq!(live.interrupt().await.code(), Some(0));
    service.stop().await;
}

/// A batch never acked is dead-lettered; `dead-letters` lists it (table
/// and JSON), `redrive` delivers it again, and `requeue` puts its item back.
#[tokio::test]
async fn dead_letters_redrive_and_requeue() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &one_per_batch("400ms", 1))).await;
    let addr = service.addr;
    let group = ["--json", "--after", "0", "--group", "g", "--consumer", "c"];
    let mut tail = Tail::start(addr, &[&group[..], &["--no-ack"]].concat());
    add(addr, "k", "poison").await;
    let poison = tail.json().await;
    let id = poison["id"].as_str().unwrap().to_owned();

    let list = ["dead-letters", "--group", "g", "--json"];
    eventually("the batch to be dead-lettered", || async {
        let dead = json_lines(&ok(&at(addr, &list).await));
        (dead.len() == 1 && dead[0]["id"] == id.as_str()).then_some(())
    })
    .await;
    let table = ok(&at(addr, &["dead-letters", "--group", "g"]).await);
    let lines = table.lines().collect::<Vec<_>>();
    assert!(lines[0].starts_with("BATCH "), "{table}");
    assert!(lines[1].starts_with(&format!("{id}  k ")), "{table}");

    let redriven = ok(&at(addr, &["redrive", "--group", "g", &id]).await);
    assert_eq!(
        redriven.trim(),
        "redriven 1 of 1 batches to consumer group g"
    );
    let again = tail.json().await;
    assert_eq!(again["id"], id.as_str(), "a re-driven batch keeps its id");

    let requeued = ok(&at(addr, &["requeue", &id, "poison"]).await);
    assert!(requeued.starts_with("requeued 1 of 1 items"), "{requeued}");
    let back = tail.json().await;
    assert_eq!(item(&back), "poison");
    assert_eq!(back["items"][0]["requeueCount"], 1);
    tail.kill().await;
    service.stop().await;
}
