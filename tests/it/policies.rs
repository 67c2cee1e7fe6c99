//! Logistics policies against a real Redis: capacity by measure (before and
//! at the limit, with close_group, after a reload, under two instances),
//! close_group, and the due-time rules max_idle and item deadlines, as
//! GetGroup shows them.

use crate::support;

use std::collections::HashMap;
use std::time::Instant;

use crate::support::load::until_answered;
use crate::support::policy::{
    Client, all_flushed, closing, due_by, due_reason, group, ids, ms, now_ms, reason, start,
    subscribe_all, weighed,
};
use crate::support::{
    Service, all_batches, assert_invalid, config, eventually, next_batch, placements, store,
    stream_len,
};
use batcher::pb;
use pb::FlushReason;
use rand::{Rng, SeedableRng};

/// Trucks of at most 1000 g and 4 parcels; other keys wait 10 minutes.
const TRUCKS: &str = r#"
[defaults]
max_items = 100
max_wait = "10m"

[keys."truck-*"]
max_items = 4
capacity = { weight_g = 1000 }
"#;

/// Adds `req`, which must be accepted.
async fn added(client: &mut Client, req: pb::AddRequest) -> pb::AddResponse {
    let resp = client.add(req).await.expect("add").into_inner();
    assert_eq!(resp.outcome, pb::AddOutcome::Added as i32, "{resp:?}");
    resp
}

/// The sum of the items' `weight_g`.
fn weight(items: &[pb::Item]) -> u64 {
    items
        .iter()
        .filter_map(|i| i.measures.get("weight_g"))
        .sum()
}

/// An item that would pass the capacity flushes the open group first
/// (CAPACITY, in `flushed` and `batches`) and opens a new group alone; an
/// unnamed measure travels with its item into the delivered batch.
#[tokio::test]
async fn an_item_that_would_pass_capacity_flushes_the_group_before_it() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    let mut stream = subscribe_all(&mut client).await;
    let a = weighed("truck-1", "a", &[("weight_g", 400), ("volume_cm3", 7)]);
    assert!(added(&mut client, a).await.batches.is_empty());
    let b = weighed("truck-1", "b", &[("weight_g", 400)]);
    assert!(added(&mut client, b).await.batches.is_empty());

    let c = weighed("truck-1", "c", &[("weight_g", 300)]);
    let resp = added(&mut client, c).await;
    assert_eq!(resp.batches.len(), 1, "{resp:?}");
    let batch = resp.flushed.clone().expect("the add flushed the group");
    assert_eq!(resp.batches[0], batch);
    assert_eq!(reason(&batch), FlushReason::Capacity);
    assert_eq!(ids(&batch.items), ["a", "b"]);
    assert_eq!(resp.group_size, 1);

    let open = group(&mut client, "truck-1")
        .await
        .expect("c opened a group");
    assert_eq!((open.size, ids(&open.items)), (1, vec!["c".to_owned()]));
    assert_eq!(open.measures.get("weight_g"), Some(&300));

    let delivered = next_batch(&mut stream).await;
    assert_eq!(delivered.id, batch.id);
    let want = HashMap::from([("weight_g".to_owned(), 400), ("volume_cm3".to_owned(), 7)]);
    assert_eq!(delivered.items[0].measures, want);
    assert_eq!(delivered.items[0].payload, b"a");
    service.stop().await;
}

/// The add whose item brings a measure's sum exactly to the capacity flushes
/// the group with that item (CAPACITY); an item without the measure counts 0.
#[tokio::test]
async fn reaching_capacity_exactly_flushes_with_the_item() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    added(&mut client, weighed("truck-1", "a", &[("weight_g", 600)])).await;
    let resp = added(&mut client, weighed("truck-1", "light", &[])).await;
    assert!(resp.batches.is_empty(), "a missing measure is 0: {resp:?}");
    assert_eq!(resp.group_size, 2);
    let open = group(&mut client, "truck-1").await.expect("open");
    assert_eq!(open.measures.get("weight_g"), Some(&600));

    let resp = added(&mut client, weighed("truck-1", "b", &[("weight_g", 400)])).await;
    assert_eq!(resp.batches.len(), 1, "{resp:?}");
    let batch = resp.flushed.expect("1000 g reaches the capacity");
    assert_eq!(reason(&batch), FlushReason::Capacity);
    assert_eq!(ids(&batch.items), ["a", "light", "b"]);
    assert_eq!(weight(&batch.items), 1000);
    assert_eq!(resp.group_size, 0);
    assert!(group(&mut client, "truck-1").await.is_none());
    service.stop().await;
}

/// An item that alone exceeds a capacity is INVALID_ARGUMENT naming the
/// measure, and nothing is written: no group, no batch, the open one untouched.
#[tokio::test]
async fn an_item_alone_over_capacity_is_refused_and_nothing_is_written() {
    let (redis, service, mut client) = start(TRUCKS).await;
    added(&mut client, weighed("truck-1", "a", &[("weight_g", 100)])).await;
    for key in ["truck-1", "truck-2"] {
        let heavy = weighed(key, "heavy", &[("weight_g", 1001)]);
        let status = client.add(heavy).await.unwrap_err();
        assert_invalid(&status, r#"item.measures["weight_g"]"#);
    }
    let open = group(&mut client, "truck-1").await.expect("still open");
    assert_eq!((open.size, ids(&open.items)), (1, vec!["a".to_owned()]));
    assert!(group(&mut client, "truck-2").await.is_none());
    assert_eq!(stream_len(&redis), 0);
    // Not even remembered for dedup: the same id, light, is accepted.
    added(&mut client, weighed("truck-2", "heavy", &[("weight_g", 1)])).await;
    service.stop().await;
}

/// With a capacity set, max_items keeps its meaning: the 4th light item flushes SIZE.
#[tokio::test]
async fn max_items_still_flushes_by_size_under_a_capacity() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    for id in ["a", "b", "c"] {
        let resp = added(&mut client, weighed("truck-1", id, &[("weight_g", 1)])).await;
        assert!(resp.batches.is_empty());
    }
    let resp = added(&mut client, weighed("truck-1", "d", &[("weight_g", 1)])).await;
    let batch = resp.flushed.expect("the 4th item flushes");
    assert_eq!(reason(&batch), FlushReason::Size);
    assert_eq!(batch.items.len(), 4);
    service.stop().await;
}

/// A close_group add whose item does not fit returns two batches, oldest
/// first: the open group (CAPACITY), then the item alone (CLOSED); a
/// subscriber gets them in that order.
#[tokio::test]
async fn close_group_with_an_item_that_does_not_fit_returns_capacity_then_closed() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, weighed("truck-1", "a", &[("weight_g", 600)])).await;
    let last = closing(weighed("truck-1", "b", &[("weight_g", 600)]));
    let resp = added(&mut client, last).await;
    let reasons: Vec<_> = resp.batches.iter().map(reason).collect();
    assert_eq!(reasons, [FlushReason::Capacity, FlushReason::Closed]);
    assert_eq!(ids(&resp.batches[0].items), ["a"]);
    assert_eq!(ids(&resp.batches[1].items), ["b"]);
    assert_eq!(resp.flushed.as_ref(), resp.batches.last());
    assert_eq!(resp.group_size, 0);
    assert!(group(&mut client, "truck-1").await.is_none());
    for expected in &resp.batches {
        assert_eq!(next_batch(&mut stream).await.id, expected.id);
    }
    service.stop().await;
}

/// close_group adds the item and flushes the group with it (CLOSED); a
/// retried close_group add is DUPLICATE and closes nothing.
#[tokio::test]
async fn close_group_flushes_with_the_item_and_a_retry_closes_nothing() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    added(&mut client, weighed("depot", "a", &[])).await;
    let resp = added(&mut client, closing(weighed("depot", "b", &[]))).await;
    let batch = resp.flushed.expect("close_group flushes");
    assert_eq!(reason(&batch), FlushReason::Closed);
    assert_eq!(ids(&batch.items), ["a", "b"]);
    assert_eq!((resp.batches.len(), resp.group_size), (1, 0));

    added(&mut client, weighed("depot", "c", &[])).await;
    let retry = closing(weighed("depot", "b", &[]));
    let resp = client.add(retry).await.unwrap().into_inner();
    assert_eq!(resp.outcome, pb::AddOutcome::Duplicate as i32);
    assert!(
        resp.flushed.is_none() && resp.batches.is_empty(),
        "{resp:?}"
    );
    assert_eq!(resp.group_size, 1);
    let open = group(&mut client, "depot")
        .await
        .expect("c's group stays open");
    assert_eq!(ids(&open.items), ["c"]);
    service.stop().await;
}

/// max_idle: a group is due (IDLE) max_idle after its latest add, an add
/// pushes that later, and the group flushes with IDLE then, not before.
#[tokio::test]
async fn max_idle_flushes_after_no_adds_and_an_add_pushes_it_later() {
    // 4 s: long enough for the second add to come first on a busy machine.
    let extra = "[defaults]\nmax_items = 100\nmax_wait = \"10m\"\nmax_idle = \"4s\"\n";
    let (_redis, service, mut client) = start(extra).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, weighed("k", "a", &[])).await;
    let first = group(&mut client, "k").await.expect("open");
    assert_eq!(due_reason(&first), FlushReason::Idle);
    assert_eq!(ms(&first.due_at), ms(&first.last_added_at) + 4000);

    support::policy::clock_past(ms(&first.last_added_at) + 700).await;
    added(&mut client, weighed("k", "b", &[])).await;
    let second = group(&mut client, "k").await.expect("still open");
    assert_eq!(due_reason(&second), FlushReason::Idle);
    assert_eq!(ms(&second.due_at), ms(&second.last_added_at) + 4000);
    assert!(ms(&second.due_at) >= ms(&first.due_at) + 700, "not pushed");

    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Idle);
    assert_eq!(ids(&batch.items), ["a", "b"]);
    let late = ms(&batch.flushed_at) - ms(&second.due_at);
    assert!((0..1500).contains(&late), "flushed {late} ms after due");
    service.stop().await;
}

/// An item deadline earlier than max_wait makes the group due at deadline -
/// deadline_lead (DEADLINE), moved earlier by a later add with a sooner
/// deadline, and it flushes then, not before; items keep their deadlines.
#[tokio::test]
async fn a_deadline_before_max_wait_flushes_at_deadline_minus_lead() {
    let extra = "[defaults]\nmax_items = 100\nmax_wait = \"10m\"\ndeadline_lead = \"1s\"\n";
    let (_redis, service, mut client) = start(extra).await;
    let mut stream = subscribe_all(&mut client).await;
    let now = now_ms();
    added(&mut client, due_by(weighed("k", "a", &[]), now + 60_000)).await;
    let open = group(&mut client, "k").await.expect("open");
    assert_eq!(due_reason(&open), FlushReason::Deadline);
    assert_eq!(ms(&open.due_at), now + 59_000);

    // 8 s: long enough for the adds and the read to come first.
    let soon = now + 8000;
    added(&mut client, due_by(weighed("k", "b", &[]), soon)).await;
    added(&mut client, weighed("k", "c", &[])).await;
    let open = group(&mut client, "k").await.expect("open");
    assert_eq!(due_reason(&open), FlushReason::Deadline);
    assert_eq!(ms(&open.due_at), soon - 1000);

    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Deadline);
    assert_eq!(ids(&batch.items), ["a", "b", "c"]);
    let late = ms(&batch.flushed_at) - (soon - 1000);
    assert!((0..1500).contains(&late), "flushed {late} ms after due");
    assert_eq!(ms(&batch.items[1].deadline), soon);
    assert!(batch.items[2].deadline.is_none());
    service.stop().await;
}

/// An item already past its deadline makes its group due at once: it
/// flushes (DEADLINE) within moments, not at max_wait.
#[tokio::test]
async fn an_item_past_its_deadline_flushes_its_group_at_once() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, weighed("k", "a", &[])).await;
    let started = Instant::now();
    let added_at = now_ms();
    added(
        &mut client,
        due_by(weighed("k", "late", &[]), added_at - 5000),
    )
    .await;
    let batch = next_batch(&mut stream).await;
    assert_eq!(reason(&batch), FlushReason::Deadline);
    assert_eq!(ids(&batch.items), ["a", "late"]);
    let after = ms(&batch.flushed_at) - added_at;
    assert!(after < 2000, "flushed {after} ms after the add");
    assert!(started.elapsed().as_secs() < 5);
    service.stop().await;
}

/// GetGroup shows the sums, the capacity, last_added_at, due_at and
/// due_reason (TIMEOUT when max_wait comes first), and the items' measures
/// and deadlines.
#[tokio::test]
async fn get_group_shows_sums_capacity_and_due_times() {
    let (_redis, service, mut client) = start(TRUCKS).await;
    let far = now_ms() + 3_600_000;
    added(
        &mut client,
        due_by(weighed("truck-1", "a", &[("weight_g", 400)]), far),
    )
    .await;
    let open = group(&mut client, "truck-1").await.expect("open");
    assert_eq!(
        open.capacity,
        HashMap::from([("weight_g".to_owned(), 1000)])
    );
    assert_eq!(open.measures.get("weight_g"), Some(&400));
    assert_eq!(ms(&open.last_added_at), ms(&open.opened_at));
    assert_eq!(due_reason(&open), FlushReason::Timeout);
    assert_eq!(ms(&open.due_at), ms(&open.opened_at) + 600_000);

    support::policy::clock_past(ms(&open.opened_at) + 20).await;
    added(&mut client, weighed("truck-1", "b", &[("weight_g", 250)])).await;
    let open = group(&mut client, "truck-1").await.expect("open");
    assert_eq!((open.size, open.measures.get("weight_g")), (2, Some(&650)));
    assert!(ms(&open.last_added_at) > ms(&open.opened_at));
    assert_eq!(ms(&open.due_at), ms(&open.opened_at) + 600_000);
    assert_eq!(open.items[0].measures.get("weight_g"), Some(&400));
    assert_eq!(ms(&open.items[0].deadline), far);
    assert!(open.items[1].deadline.is_none());
    service.stop().await;
}

/// A reload (SIGHUP) that lowers a capacity applies to the next add: an
/// item that fitted before now flushes the group first, and one alone over
/// the new capacity is refused.
#[tokio::test]
async fn a_reload_lowering_capacity_applies_to_the_next_add() {
    let redis = support::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let write = |cap: u64| {
        let url = redis.url();
        let policy = format!(
            "[defaults]\nmax_items = 100\nmax_wait = \"10m\"\ncapacity = {{ weight_g = {cap} }}\n"
        );
        let text = support::config_text(&url, &policy);
        std::fs::write(&path, text).unwrap();
    };
    write(1000);
    let process = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(process.addr).await;
    added(&mut client, weighed("k", "a", &[("weight_g", 300)])).await;

    write(500);
    process.signal(libc::SIGHUP);
    eventually("the reload to take effect", || {
        let mut client = client.clone();
        async move {
            let open = group(&mut client, "k").await?;
            (open.capacity.get("weight_g") == Some(&500)).then_some(())
        }
    })
    .await;
    let status = client
        .add(weighed("k", "heavy", &[("weight_g", 600)]))
        .await
        .unwrap_err();
    assert_invalid(&status, r#"item.measures["weight_g"]"#);
    let resp = added(&mut client, weighed("k", "b", &[("weight_g", 300)])).await;
    let reasons: Vec<_> = resp.batches.iter().map(reason).collect();
    assert_eq!(reasons, [FlushReason::Capacity]);
    assert_eq!(ids(&resp.batches[0].items), ["a"]);
    assert_eq!(resp.group_size, 1);
}

/// Groups of at most 1000 g or 10 items, flushed 300 ms after they open.
const SHARED: &str = r#"
[defaults]
max_items = 10
max_wait = "300ms"
capacity = { weight_g = 1000 }
[sweeper]
max_sleep = "50ms"
"#;

/// One caller of the two-instance test: 60 adds of distinct ids over 4
/// keys, weighing 1 to 400 g, retrying an UNAVAILABLE add until answered.
/// Returns the (key, id) pairs it added; checks every batch it is handed.
async fn weighed_caller(client: Client, task: u64) -> Vec<(String, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(task);
    let mut accepted = Vec::new();
    for i in 0..60 {
        let key = format!("truck-{}", rng.random_range(0..4));
        let id = format!("t{task}-{i}");
        let req = weighed(&key, &id, &[("weight_g", rng.random_range(1..=400))]);
        let (resp, _) = until_answered(&id, || {
            let mut client = client.clone();
            let req = req.clone();
            async move { client.add(req).await }
        })
        .await;
        for batch in &resp.batches {
            assert!(weight(&batch.items) <= 1000, "{batch:?}");
        }
        accepted.push((key, id));
    }
    accepted
}

/// Under two instances on one Redis, concurrent adds with weights land each
/// in exactly one batch, and no batch passes the capacity or max_items.
/// The runtime has 4 worker threads, so the callers run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_with_capacity_flushes_under_two_instances() {
    let redis = support::RedisServer::start();
    let cfg = config(&redis.url(), SHARED);
    let a = Service::start(cfg.clone()).await;
    let b = Service::start(cfg.clone()).await;
    let mut tasks = Vec::new();
    for task in 0..8 {
        let client = if task % 2 == 0 { &a } else { &b }.client().await;
        tasks.push(tokio::spawn(weighed_caller(client, task)));
    }
    let mut accepted = Vec::new();
    for task in tasks {
        accepted.extend(task.await.unwrap());
    }
    all_flushed(&a.client().await).await;
    let batches = all_batches(&store(&cfg)).await;
    for batch in &batches {
        let grams: u64 = batch
            .items
            .iter()
            .filter_map(|i| i.measures.get("weight_g"))
            .sum();
        assert!(grams <= 1000 && batch.items.len() <= 10, "{batch:?}");
    }
    let placed = placements(&batches);
    assert_eq!(placed.len(), accepted.len(), "batches hold other items");
    for item in &accepted {
        assert_eq!(placed.get(item), Some(&1), "{item:?}");
    }
    let capacity = batcher::batch::FlushReason::Capacity;
    assert!(batches.iter().any(|b| b.reason == capacity));
    a.stop().await;
    b.stop().await;
}
