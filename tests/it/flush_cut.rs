//! No batch exceeds the `max_items` in force, even for a group opened under a
//! larger one: after a reload lowers it, every flush path (manual, timeout,
//! and the add that completes a group) cuts the group into batches of at most
//! the new `max_items`, oldest first, in one atomic step, with one reason.

use crate::support;

use std::time::Duration;

use batcher::batch::AddOutcome;
use batcher::batch::{Batch, FlushReason, Item};
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::policy::{Policies, Policy, PolicyHandle};
use batcher::store::{NewItem, RedisTarget, Store, Timeouts};

use crate::support::{RedisServer, add, eventually, next_batch};

/// A store whose policies the test swaps, as a reload does.
fn open(redis: &RedisServer, handle: &PolicyHandle) -> Store {
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        response: Duration::from_secs(5),
    };
    Store::open(
        &RedisTarget::single(&redis.url(), timeouts),
        Keyspace::new("cut", 4),
        Duration::from_secs(600),
        handle.clone(),
    )
    .expect("store")
}

fn policy(max_items: u32, max_wait: Duration) -> Policy {
    Policy::basic(max_items, max_wait, None)
}

/// Adds `count` items `i0, i1, ...` to `key` under `policy`, one call each.
async fn fill(store: &Store, key: &str, count: usize, policy: Policy) {
    for i in 0..count {
        let report = store
            .add(vec![NewItem {
                key: key.into(),
                item: Item::new(format!("i{i}"), vec![b'p'; i]),
                policy: policy.clone(),
                close: false,
                requeue_of: None,
            }])
            .await
            .expect("add");
        assert_eq!(report.results[0].outcome, AddOutcome::Added);
        assert!(
            report.results[0].flushed.is_empty(),
            "no flush while filling"
        );
    }
}

/// A store whose group `key` holds `count` items, opened under max_items 10,
/// after a reload has lowered max_items to `new_max` (same `max_wait`).
async fn reloaded(
    redis: &RedisServer,
    key: &str,
    count: usize,
    max_wait: Duration,
    new_max: u32,
) -> Store {
    let old = policy(10, max_wait);
    let handle = PolicyHandle::new(Policies::new(old.clone(), []));
    let store = open(redis, &handle);
    fill(&store, key, count, old.clone()).await;
    handle.replace(Policies::new(policy(new_max, max_wait), []));
    store
}

/// The flush wrote batches of `sizes` items, oldest first, all for `reason`,
/// emptied the group, and they are all the stream holds.
async fn assert_cut(
    store: &Store,
    key: &str,
    batches: &[Batch],
    sizes: &[usize],
    reason: FlushReason,
) {
    assert_eq!(ids(batches), expected(sizes));
    assert!(batches.iter().all(|b| b.reason == reason));
    assert!(store.group(key).await.unwrap().is_none());
    assert_eq!(support::all_batches(store).await, batches);
}

/// The item ids of each batch, in order.
fn ids(batches: &[Batch]) -> Vec<Vec<String>> {
    batches
        .iter()
        .map(|b| {
            b.items
                .iter()
                .map(|i| String::from_utf8(i.id.clone()).unwrap())
                .collect()
        })
        .collect()
}

fn expected(sizes: &[usize]) -> Vec<Vec<String>> {
    let mut next = 0;
    sizes
        .iter()
        .map(|size| {
            let ids = (next..next + size).map(|i| format!("i{i}")).collect();
            next += size;
            ids
        })
        .collect()
}

/// A manual Flush of 8 items opened under max_items 10, after it drops to 3,
/// writes batches of 3, 3 and 2, oldest first, all MANUAL, and empties the group.
#[tokio::test]
async fn manual_flush_cuts_into_batches_of_the_new_max() {
    let redis = RedisServer::start();
    let store = reloaded(&redis, "north", 8, Duration::from_secs(600), 3).await;
    let batches = store.flush("north", FlushReason::Manual).await.unwrap();

    assert_cut(&store, "north", &batches, &[3, 3, 2], FlushReason::Manual).await;
    assert!(batches.windows(2).all(|w| w[0].stream_id < w[1].stream_id));
    assert_eq!(batches[2].items[1].payload, vec![b'p'; 7]);
}

/// A timeout flush of 7 items opened under max_items 10, after it drops to 2,
/// writes batches of 2, 2, 2 and 1, all TIMEOUT, once the group is due.
#[tokio::test]
async fn timeout_flush_cuts_into_batches_of_the_new_max() {
    let redis = RedisServer::start();
    let store = reloaded(&redis, "south", 7, Duration::from_millis(300), 2).await;
    let shard = store.keyspace().shard_of("south");
    let batches = eventually("the group to fall due and flush", || {
        let store = store.clone();
        async move {
            let batches = store.flush_due(shard, &["south".into()]).await.unwrap();
            (!batches.is_empty()).then_some(batches)
        }
    })
    .await;

    assert_cut(
        &store,
        "south",
        &batches,
        &[2, 2, 2, 1],
        FlushReason::Timeout,
    )
    .await;
}

/// An add to a group of 7 opened under max_items 10, after it drops to 3,
/// writes two full batches of 3 and keeps the other 2 items open, in order.
#[tokio::test]
async fn completing_add_cuts_full_batches_and_keeps_the_rest() {
    let redis = RedisServer::start();
    let store = reloaded(&redis, "east", 7, Duration::from_secs(600), 3).await;
    let new = policy(3, Duration::from_secs(600));
    let report = store
        .add(vec![NewItem {
            key: "east".into(),
            item: Item::new("i7", ""),
            policy: new,
            close: false,
            requeue_of: None,
        }])
        .await
        .unwrap();
    assert_eq!(report.results[0].group_size, 2);
    let all = support::all_batches(&store).await;
    assert_eq!(ids(&all), expected(&[3, 3]));
    assert!(all.iter().all(|b| b.reason == FlushReason::Size));
    assert_eq!(
        report.results[0].flushed, all,
        "the add reports every batch it wrote"
    );
    let open = store
        .group("east")
        .await
        .unwrap()
        .expect("the rest stays open");
    let open_ids: Vec<_> = open.items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(open_ids, vec![b"i6".to_vec(), b"i7".to_vec()]);
    assert_eq!(open.size, 2);
    assert_eq!(open.bytes, 6);
}

/// Through the service: after a SIGHUP lowers max_items from 10 to 3, a Flush
/// of 7 items answers with batches of 3, 3 and 1, which subscribers receive.
#[tokio::test]
async fn flush_rpc_after_a_reload_returns_every_batch_of_the_cut() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let write = |max_items: u32| {
        let url = redis.url();
        let text = support::config_text(&url, &format!("[defaults]\nmax_items = {max_items}\n"));
        std::fs::write(&path, text).unwrap();
    };
    write(10);
    let process = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(process.addr).await;
    let mut stream = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    for id in ["1", "2", "3", "4", "5", "6", "7"] {
        client.add(add("big", id, b"")).await.unwrap();
    }

    write(3);
    process.signal(libc::SIGHUP);
    eventually("the reload to take effect", || {
        let mut client = client.clone();
        async move {
            let req = pb::GetGroupRequest { key: "big".into() };
            let group = client.get_group(req).await.ok()?.into_inner().group?;
            (group.max_items == 3).then_some(())
        }
    })
    .await;
    let req = pb::FlushRequest { key: "big".into() };
    let flushed = client.flush(req).await.unwrap().into_inner();

    let sizes: Vec<usize> = flushed.batches.iter().map(|b| b.items.len()).collect();
    assert_eq!(sizes, vec![3, 3, 1]);
    assert_eq!(flushed.batch.as_ref(), flushed.batches.first());
    for expected in &flushed.batches {
        assert_eq!(expected.reason, pb::FlushReason::Manual as i32);
        let got = next_batch(&mut stream).await;
        assert_eq!((&got.id, &got.items), (&expected.id, &expected.items));
    }
}

/// Adds items `i{from}..i{to}` to `key` under `policy` in one call (payload
/// `{n},:`, which holds the characters a batch's values are cut at), and
/// returns the batches the call flushed.
async fn add_range(
    store: &Store,
    key: &str,
    from: usize,
    to: usize,
    policy: &Policy,
) -> Vec<Batch> {
    let items = (from..to)
        .map(|i| NewItem {
            key: key.into(),
            item: Item::new(format!("i{i}"), format!("{i},:")),
            policy: policy.clone(),
            close: false,
            requeue_of: None,
        })
        .collect();
    let report = store.add(items).await.expect("add");
    assert!(
        report
            .results
            .iter()
            .all(|r| r.outcome == AddOutcome::Added)
    );
    report.results.into_iter().flat_map(|r| r.flushed).collect()
}

/// Large groups flush whole and in arrival order: 300 items (more than
/// Redis keeps in a compact hash, which then gives its fields in no set
/// order) completed by an add, or flushed by hand; 2,500 (more than a batch
/// carries as its entry's fields) completed by an add, or 2,100 flushed by
/// hand. The stream holds the batches the calls returned.
#[tokio::test]
async fn large_groups_flush_whole_and_in_arrival_order() {
    let redis = RedisServer::start();
    let handle = PolicyHandle::new(Policies::new(policy(3000, Duration::from_secs(600)), []));
    let store = open(&redis, &handle).with_max_queued_adds(5000.try_into().unwrap());
    let mut flushed = Vec::new();
    for (key, max, count) in [("a", 300, 300), ("b", 2500, 2500)] {
        let policy = policy(max, Duration::from_secs(600));
        assert!(
            add_range(&store, key, 0, count - 1, &policy)
                .await
                .is_empty()
        );
        let batches = add_range(&store, key, count - 1, count, &policy).await;
        assert_eq!(ids(&batches), expected(&[count]), "{key}");
        assert_eq!(batches[0].reason, FlushReason::Size);
        flushed.extend(batches);
    }
    for (key, count) in [("c", 300), ("d", 2100)] {
        let policy = policy(3000, Duration::from_secs(600));
        assert!(add_range(&store, key, 0, count, &policy).await.is_empty());
        let batches = store.flush(key, FlushReason::Manual).await.unwrap();
        assert_eq!(ids(&batches), expected(&[count]), "{key}");
        flushed.extend(batches);
    }
    for batch in &flushed {
        assert!(store.group(&batch.key).await.unwrap().is_none());
        let payloads = batch.items.iter().enumerate();
        assert!(
            payloads
                .clone()
                .all(|(i, item)| item.payload == format!("{i},:").as_bytes())
        );
    }
    let mut stored = support::all_batches(&store).await;
    stored.sort_by_key(|b| b.key.clone());
    assert_eq!(stored, flushed);
}
