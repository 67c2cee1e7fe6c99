//! The policy rules as the scripts apply them, driven through the store
//! directly so each decision is seen without a sweeper: capacity before and
//! after an item, close_group, the due time each rule sets, the min_items
//! hold, Remove giving a deadline back, and Requeue's once-per-item marker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use batcher::batch::{AddOutcome, AddResult};
use batcher::batch::{FlushReason, Item, OpenLimit};
use batcher::keys::Keyspace;
use batcher::policy::{Overflow, Policies, Policy, PolicyHandle};
use batcher::store::{NewItem, RedisTarget, Store, Timeouts};

use crate::support::{RedisServer, eventually};

pub(crate) fn open(redis: &RedisServer, policy: &Policy) -> Store {
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        response: Duration::from_secs(5),
    };
    let handle = PolicyHandle::new(Policies::new(policy.clone(), []));
    Store::open(
        &RedisTarget::single(&redis.url(), timeouts),
        Keyspace::new("pol", 4),
        Duration::from_secs(600),
        handle,
    )
    .expect("store")
}

/// A policy of 100 items and 10 minutes with a weight capacity of 10.
fn truck() -> Policy {
    Policy {
        capacity: Arc::new(BTreeMap::from([("kg".to_owned(), 10)])),
        ..Policy::basic(100, Duration::from_secs(600), None)
    }
}

fn parcel(id: &str, kg: Option<u64>) -> Item {
    let mut item = Item::new(id, format!("p-{id}"));
    if let Some(kg) = kg {
        item.measures.insert("kg".into(), kg);
    }
    item
}

async fn add(store: &Store, policy: &Policy, item: Item, close: bool) -> AddResult {
    let new = NewItem {
        key: "k".into(),
        item,
        policy: policy.clone(),
        close,
        requeue_of: None,
    };
    let mut report = store.add(vec![new]).await.expect("add");
    report.results.remove(0)
}

fn ids(result: &AddResult) -> Vec<Vec<String>> {
    result
        .flushed
        .iter()
        .map(|b| {
            b.items
                .iter()
                .map(|i| String::from_utf8_lossy(&i.id).into_owned())
                .collect()
        })
        .collect()
}

/// Adds parcels (key, id, policy) in one store call: one script call when
/// their keys share a shard.
async fn add_all(store: &Store, items: &[(&str, &str, &Policy)]) -> Vec<AddResult> {
    let new = items
        .iter()
        .map(|(key, id, policy)| NewItem {
            key: key.to_string(),
            item: parcel(id, None),
            policy: (*policy).clone(),
            close: false,
            requeue_of: None,
        })
        .collect();
    store.add(new).await.expect("add").results
}

fn outcomes(results: &[AddResult]) -> Vec<(AddOutcome, u32)> {
    results
        .iter()
        .map(|r| (r.outcome.clone(), r.group_size))
        .collect()
}

/// An item that would not fit flushes the group first (CAPACITY) and opens
/// the next; sums that reach the capacity flush with the item; a missing
/// measure counts 0; close_group after a capacity flush writes two batches.
#[tokio::test]
async fn capacity_flushes_before_and_at_the_limit() {
    let redis = RedisServer::start();
    let policy = truck();
    let store = open(&redis, &policy);
    assert!(
        add(&store, &policy, parcel("a", Some(4)), false)
            .await
            .flushed
            .is_empty()
    );
    assert!(
        add(&store, &policy, parcel("b", None), false)
            .await
            .flushed
            .is_empty()
    );
    let c = add(&store, &policy, parcel("c", Some(7)), false).await;
    assert_eq!(ids(&c), [["a", "b"]], "a and b leave before c");
    assert_eq!(c.flushed[0].reason, FlushReason::Capacity);
    assert_eq!(c.group_size, 1);
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.measures.get("kg"), Some(&7));
    let d = add(&store, &policy, parcel("d", Some(3)), false).await;
    assert_eq!(ids(&d), [["c", "d"]], "7 + 3 reaches 10");
    assert_eq!(d.flushed[0].reason, FlushReason::Capacity);
    assert_eq!(d.flushed[0].items[1].measures.get("kg"), Some(&3));
    assert_eq!(d.group_size, 0);

    add(&store, &policy, parcel("e", Some(9)), false).await;
    let f = add(&store, &policy, parcel("f", Some(2)), true).await;
    assert_eq!(ids(&f), [vec!["e"], vec!["f"]]);
    let reasons: Vec<FlushReason> = f.flushed.iter().map(|b| b.reason).collect();
    assert_eq!(reasons, [FlushReason::Capacity, FlushReason::Closed]);
    assert!(store.group("k").await.unwrap().is_none());
}

/// A deadline earlier than max_wait sets the due time to deadline - lead,
/// with reason DEADLINE; removing that item gives the due time back.
#[tokio::test]
async fn deadline_sets_due_and_remove_gives_it_back() {
    let redis = RedisServer::start();
    let policy = Policy {
        deadline_lead: Duration::from_secs(60),
        ..Policy::basic(100, Duration::from_secs(3600), None)
    };
    let store = open(&redis, &policy);
    add(&store, &policy, parcel("a", None), false).await;
    let plain = store.group("k").await.unwrap().expect("open");
    assert_eq!(plain.due_reason, FlushReason::Timeout);
    let deadline = plain.opened_at_ms + 600_000;
    let mut express = parcel("b", None);
    express.deadline_ms = Some(deadline);
    add(&store, &policy, express, false).await;
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.due_reason, FlushReason::Deadline);
    assert_eq!(group.due_at_ms, deadline - 60_000);
    assert_eq!(group.items[1].deadline_ms, Some(deadline));
    assert_eq!(group.max_wait, Duration::from_secs(3600));
    assert!(store.remove("k", b"b").await.unwrap().0);
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.due_reason, FlushReason::Timeout);
    assert_eq!(group.due_at_ms, plain.due_at_ms);
}

/// Under a policy with no rules, an item's deadline sets its group's due
/// time; plain items after it, which take the add's shorter usual path,
/// keep that due time, are told apart from a duplicate, and flush with it
/// in arrival order, the deadline carried in the batch.
#[tokio::test]
async fn plain_items_keep_a_deadline_set_before_them() {
    let redis = RedisServer::start();
    let policy = Policy::basic(4, Duration::from_secs(3600), None);
    let store = open(&redis, &policy);
    add(&store, &policy, parcel("a", None), false).await;
    let opened = store.group("k").await.unwrap().expect("open").opened_at_ms;
    let mut express = parcel("b", None);
    express.deadline_ms = Some(opened + 600_000);
    add(&store, &policy, express, false).await;
    let c = add(&store, &policy, parcel("c", None), false).await;
    assert_eq!((c.outcome, c.group_size), (AddOutcome::Added, 3));
    let again = add(&store, &policy, parcel("c", None), false).await;
    assert_eq!(
        (again.outcome, again.group_size),
        (AddOutcome::Duplicate, 3)
    );
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.due_reason, FlushReason::Deadline);
    assert_eq!(group.due_at_ms, opened + 600_000);
    let d = add(&store, &policy, parcel("d", None), false).await;
    assert_eq!(d.group_size, 0);
    assert_eq!(ids(&d), [["a", "b", "c", "d"]]);
    let batch = &d.flushed[0];
    assert_eq!(batch.reason, FlushReason::Size);
    assert_eq!(batch.items[1].deadline_ms, Some(opened + 600_000));
    assert_eq!(batch.items[2].payload, b"p-c");
    assert!(store.group("k").await.unwrap().is_none());
}

/// A call that brings each of its groups one item (keys of one shard, so
/// one script call) takes every item right, under a plain policy and one
/// with rules alike: a duplicate of an open id, a group filled by its item
/// flushing alone, a flushed id refused for the dedup window, and the
/// rule-bound group keeping its own due reason.
#[tokio::test]
async fn a_call_of_one_item_per_group_takes_each_right() {
    use AddOutcome::{Added, Duplicate};
    let redis = RedisServer::start();
    let plain = Policy::basic(2, Duration::from_secs(3600), None);
    let idle = Policy {
        max_idle: Some(Duration::from_secs(60)),
        ..Policy::basic(5, Duration::from_secs(3600), None)
    };
    let store = open(&redis, &plain);
    let keyspace = Keyspace::new("pol", 4);
    let keys: Vec<String> = (0..)
        .map(|n| format!("area-{n}"))
        .filter(|k| keyspace.shard_of(k) == 1)
        .take(3)
        .collect();
    let (k1, k2, k3) = (keys[0].as_str(), keys[1].as_str(), keys[2].as_str());
    let first = add_all(
        &store,
        &[(k1, "a", &plain), (k2, "b", &plain), (k3, "c", &idle)],
    )
    .await;
    assert_eq!(outcomes(&first), [(Added, 1), (Added, 1), (Added, 1)]);

    let second = add_all(
        &store,
        &[(k1, "a", &plain), (k2, "d", &plain), (k3, "e", &idle)],
    )
    .await;
    assert_eq!(outcomes(&second), [(Duplicate, 1), (Added, 0), (Added, 2)]);
    assert_eq!(ids(&second[1]), [["b", "d"]]);
    assert!(second[0].flushed.is_empty() && second[2].flushed.is_empty());

    let third = add_all(
        &store,
        &[(k1, "f", &plain), (k2, "b", &plain), (k3, "c", &idle)],
    )
    .await;
    assert_eq!(
        outcomes(&third),
        [(Added, 0), (Duplicate, 0), (Duplicate, 2)]
    );
    assert_eq!(ids(&third[0]), [["a", "f"]]);
    let group = store.group(&keys[2]).await.unwrap().expect("open");
    assert_eq!((group.size, group.due_reason), (2, FlushReason::Idle));
    assert!(store.group(&keys[1]).await.unwrap().is_none());
}

/// A call that brings a plain group several items (an AddMany from a
/// scanner) answers each as it would one at a time: an id repeated in the
/// call or already open is a duplicate at the size then, the others are
/// added in order, and items that complete the group flush it whole.
#[tokio::test]
async fn a_call_of_several_items_for_a_group_takes_each_in_order() {
    use AddOutcome::{Added, Duplicate};
    let redis = RedisServer::start();
    let policy = Policy::basic(5, Duration::from_secs(3600), None);
    let store = open(&redis, &policy);
    let call = |ids: [&'static str; 4]| ids.map(|id| ("k", id, &policy));
    let first = add_all(&store, &call(["a", "b", "a", "c"])).await;
    assert_eq!(
        outcomes(&first),
        [(Added, 1), (Added, 2), (Duplicate, 2), (Added, 3)]
    );
    let second = add_all(&store, &call(["b", "d", "e", "f"])).await;
    assert_eq!(
        outcomes(&second),
        [(Duplicate, 3), (Added, 4), (Added, 0), (Added, 1)]
    );
    assert_eq!(ids(&second[2]), [["a", "b", "c", "d", "e"]]);
    let third = add_all(&store, &[("k", "c", &policy), ("k", "g", &policy)]).await;
    assert_eq!(outcomes(&third), [(Duplicate, 1), (Added, 2)]);
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.size, 2);
}

/// Each add moves an IDLE due time to the last arrival plus max_idle.
#[tokio::test]
async fn idle_moves_with_each_add() {
    let redis = RedisServer::start();
    let policy = Policy {
        max_idle: Some(Duration::from_secs(60)),
        ..Policy::basic(100, Duration::from_secs(3600), None)
    };
    let store = open(&redis, &policy);
    add(&store, &policy, parcel("a", None), false).await;
    let first = store.group("k").await.unwrap().expect("open");
    assert_eq!(first.due_reason, FlushReason::Idle);
    assert_eq!(first.due_at_ms, first.last_added_ms + 60_000);
    // A new id each time: a duplicate is not an arrival and moves nothing.
    let mut n = 0;
    let later = eventually("a later clock", || {
        n += 1;
        let id = format!("b{n}");
        let (store, policy) = (&store, &policy);
        async move {
            add(store, policy, parcel(&id, None), false).await;
            let g = store.group("k").await.unwrap().expect("open");
            (g.last_added_ms > first.last_added_ms).then_some(g)
        }
    })
    .await;
    assert_eq!(later.due_at_ms, later.last_added_ms + 60_000);
}

/// A TIMEOUT below min_items holds the group open, re-armed to max_age; a
/// flush by due time then writes nothing until max_age, and MAX_AGE flushes.
/// (Under a capacity, so the flush reads the group's count from its s.)
#[tokio::test]
async fn min_items_holds_until_max_age() {
    let redis = RedisServer::start();
    let policy = Policy {
        min_items: 3,
        max_age: Some(Duration::from_millis(1500)),
        capacity: Arc::new(BTreeMap::from([("kg".to_owned(), 10)])),
        ..Policy::basic(100, Duration::from_millis(200), None)
    };
    let store = open(&redis, &policy);
    add(&store, &policy, parcel("a", None), false).await;
    let opened = store.group("k").await.unwrap().expect("open");
    let held = eventually("the hold", || async {
        let flushed = store.flush("k", FlushReason::Timeout).await.unwrap();
        assert!(flushed.is_empty(), "a group below min_items is held");
        let g = store.group("k").await.unwrap().expect("still open");
        (g.due_reason == FlushReason::MaxAge).then_some(g)
    })
    .await;
    assert_eq!(held.due_at_ms, opened.opened_at_ms + 1500);
    let batches = eventually("max_age", || async {
        let flushed = store.flush("k", FlushReason::Timeout).await.unwrap();
        // A flush that ended before max_age must not have written a batch.
        let ended = crate::support::policy::now_ms() as u64;
        if !flushed.is_empty() {
            assert!(
                ended >= held.due_at_ms,
                "flushed at {ended}, before max_age"
            );
        }
        (!flushed.is_empty()).then_some(flushed)
    })
    .await;
    assert_eq!(batches[0].reason, FlushReason::MaxAge);
}

/// Requeued items skip the dedup window once per (batch, item), carry
/// requeue_count + 1, and a repeat is a duplicate.
#[tokio::test]
async fn requeue_once_per_batch_item() {
    let redis = RedisServer::start();
    let policy = Policy::basic(2, Duration::from_secs(600), None);
    let store = open(&redis, &policy);
    add(&store, &policy, parcel("a", Some(1)), false).await;
    let done = add(&store, &policy, parcel("b", None), false).await;
    let batch = done.flushed[0].clone();
    let again = add(&store, &policy, parcel("a", Some(1)), false).await;
    assert_eq!(
        again.outcome,
        AddOutcome::Duplicate,
        "inside the dedup window"
    );
    let requeue = |item: Item| NewItem {
        key: "k".into(),
        item: Item {
            requeue_count: item.requeue_count + 1,
            ..item
        },
        policy: policy.clone(),
        close: false,
        requeue_of: Some(batch.id()),
    };
    let a = batch.items[0].clone();
    let report = store.add(vec![requeue(a.clone())]).await.unwrap();
    assert_eq!(report.results[0].outcome, AddOutcome::Added);
    let report = store.add(vec![requeue(a)]).await.unwrap();
    assert_eq!(report.results[0].outcome, AddOutcome::Duplicate);
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!(group.items[0].requeue_count, 1);
    assert_eq!(group.items[0].measures.get("kg"), Some(&1));
}

/// Parcels (a 32-byte payload, a weight and a volume, some with a
/// deadline, one with a measure the capacity does not name) keep their
/// group in Redis's compact encoding but for the one whose extra measure
/// takes its value past 64 bytes; GetGroup, Remove and the flush read every
/// measure, deadline and payload back.
#[tokio::test]
async fn parcels_stay_compact_and_read_back() {
    let redis = RedisServer::start();
    let policy = Policy {
        capacity: Arc::new(BTreeMap::from([
            ("volume_cm3".to_owned(), 1_000_000),
            ("weight_g".to_owned(), 1_000_000),
        ])),
        ..Policy::basic(100, Duration::from_secs(600), None)
    };
    let store = open(&redis, &policy);
    let keyspace = Keyspace::new("pol", 4);
    let mut con = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let far = 4_000_000_000_000;
    for n in 0..4u64 {
        let mut item = Item::new(format!("p{n}"), format!("{n:0>32}"));
        item.measures.insert("weight_g".into(), 1200 + n);
        item.measures.insert("volume_cm3".into(), 50_000);
        if n < 3 {
            item.deadline_ms = Some(far + n);
        }
        add(&store, &policy, item, false).await;
    }
    let encoding = |con: &mut redis::Connection, key: &str| -> String {
        let gkey = keyspace.group(keyspace.shard_of(key), key);
        redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&gkey)
            .query(con)
            .unwrap()
    };
    assert_eq!(
        encoding(&mut con, "k"),
        "listpack",
        "a parcel left the compact encoding"
    );

    assert!(store.remove("k", b"p1").await.unwrap().0);
    let group = store.group("k").await.unwrap().expect("open");
    let got: Vec<_> = group.items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(got, [&b"p0"[..], b"p2", b"p3"].map(<[u8]>::to_vec));
    assert_eq!(group.items[1].measures.get("weight_g"), Some(&1202));
    assert_eq!(group.items[1].deadline_ms, Some(far + 2));
    assert_eq!(group.items[2].deadline_ms, None);
    assert_eq!(group.measures.get("weight_g"), Some(&(1200 + 1202 + 1203)));
    assert_eq!(group.measures.get("volume_cm3"), Some(&150_000));

    let mut extra = Item::new("p4", format!("{:0>32}", 4));
    extra.measures.insert("weight_g".into(), 1);
    extra.measures.insert("colli".into(), 3);
    add(&store, &policy, extra, false).await;
    assert_eq!(encoding(&mut con, "k"), "hashtable", "a 70-byte value");

    let batches = store.flush("k", FlushReason::Manual).await.unwrap();
    let items = &batches[0].items;
    assert_eq!(items.len(), 4);
    assert_eq!(items[0].measures.get("volume_cm3"), Some(&50_000));
    assert_eq!(items[0].deadline_ms, Some(far));
    assert_eq!(items[1].payload, format!("{:0>32}", 2).into_bytes());
    assert_eq!(items[2].measures.get("volume_cm3"), Some(&50_000));
    assert_eq!(items[3].measures.get("colli"), Some(&3));
    assert_eq!(items[3].measures.get("volume_cm3"), None);
}

fn weighed(id: &str, measures: &[(&str, u64)]) -> Item {
    let mut item = Item::new(id, format!("p-{id}"));
    item.measures = measures.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    item
}

fn with_capacity(capacity: &[(&str, u64)]) -> Policy {
    Policy {
        capacity: Arc::new(capacity.iter().map(|(n, v)| (n.to_string(), *v)).collect()),
        ..Policy::basic(100, Duration::from_secs(600), None)
    }
}

/// The sums a capacity decision reads are the group's own: after a reload
/// took the capacity away and items came in, after a Remove, and after a
/// reload that names other measures, whose packed items keep every measure.
#[tokio::test]
async fn capacity_sums_follow_reloads_and_removes() {
    let redis = RedisServer::start();
    let kg = with_capacity(&[("kg", 10)]);
    let store = open(&redis, &kg);
    add(&store, &kg, weighed("a", &[("kg", 4), ("l", 2)]), false).await;
    // No capacity for a while: b's 5 kg are not summed as it comes in.
    let none = with_capacity(&[]);
    add(&store, &none, weighed("b", &[("kg", 5), ("l", 3)]), false).await;
    // Back to 10 kg: 4 + 5 + 2 would be 11, so c opens the next group.
    let c = add(&store, &kg, weighed("c", &[("kg", 2), ("l", 4)]), false).await;
    assert_eq!(ids(&c), [["a", "b"]], "the sums missed b's 5 kg");
    assert_eq!(c.flushed[0].reason, FlushReason::Capacity);
    assert_eq!(c.flushed[0].items[1].measures.get("l"), Some(&3));

    // c (2 kg) and d (6 kg) are 8; without d, e's 7 kg fit beside c.
    add(&store, &kg, weighed("d", &[("kg", 6), ("l", 1)]), false).await;
    assert!(store.remove("k", b"d").await.unwrap().0);
    let e = add(&store, &kg, weighed("e", &[("kg", 7), ("l", 5)]), false).await;
    assert!(
        e.flushed.is_empty(),
        "the sums kept the removed item's 6 kg"
    );

    // Now litres are the capacity: c's 4 and e's 5 are 9 of 10, so f's 2 l
    // do not fit; the batch still has every item's kilograms and litres.
    let litres = with_capacity(&[("l", 10)]);
    let f = add(&store, &litres, weighed("f", &[("kg", 1), ("l", 2)]), false).await;
    assert_eq!(ids(&f), [["c", "e"]], "c and e hold 9 l");
    let c_back = &f.flushed[0].items[0];
    assert_eq!(
        c_back.measures,
        weighed("c", &[("kg", 2), ("l", 4)]).measures
    );
    let g = add(&store, &litres, weighed("g", &[("kg", 9), ("l", 8)]), false).await;
    assert_eq!(ids(&g), [["f", "g"]], "2 + 8 reaches 10 l");
    assert_eq!(g.flushed[0].items[0].measures.get("kg"), Some(&1));
}

/// A Remove takes the item's measures out of its group's sums, also when
/// the store's own policy has another capacity than the one the group was
/// written under: the next add under that capacity sees them without it.
#[tokio::test]
async fn remove_takes_the_item_out_of_the_sums() {
    let redis = RedisServer::start();
    let kg = with_capacity(&[("kg", 10)]);
    let litres = with_capacity(&[("l", 10)]);
    let store = open(&redis, &kg);
    add(&store, &litres, weighed("a", &[("kg", 4), ("l", 2)]), false).await;
    add(&store, &litres, weighed("b", &[("kg", 3), ("l", 3)]), false).await;
    assert!(store.remove("k", b"b").await.unwrap().0);
    let group = store.group("k").await.unwrap().expect("open");
    assert_eq!((group.size, group.bytes), (1, 3));
    // a's 2 l and c's 8 reach 10; with b's 3 still summed, c would not fit.
    let c = add(&store, &litres, weighed("c", &[("kg", 1), ("l", 8)]), false).await;
    assert_eq!(ids(&c), [["a", "c"]]);
    assert_eq!(c.flushed[0].reason, FlushReason::Capacity);
}

/// Parcels are summed as they come, leave the sums when removed, and keep
/// every measure when a reload renames the capacity and their packed
/// values are written anew for it.
#[tokio::test]
async fn parcels_follow_reloads_and_removes() {
    let redis = RedisServer::start();
    let both = with_capacity(&[("kg", 10), ("l", 10)]);
    let store = open(&redis, &both);
    add(&store, &both, weighed("a", &[("kg", 4), ("l", 2)]), false).await;
    add(&store, &both, weighed("b", &[("kg", 5), ("l", 3)]), false).await;
    // a and b are 9 kg: c's 2 kg would not fit.
    let c = add(&store, &both, weighed("c", &[("kg", 2), ("l", 1)]), false).await;
    assert_eq!(ids(&c), [["a", "b"]], "the sums missed a short ext");
    assert_eq!(
        c.flushed[0].items[1].measures,
        weighed("b", &[("kg", 5), ("l", 3)]).measures
    );

    // With d, e's 7 kg would not fit; without it they do, beside c's 2.
    add(&store, &both, weighed("d", &[("kg", 3), ("l", 3)]), false).await;
    assert!(store.remove("k", b"d").await.unwrap().0);
    let e = add(&store, &both, weighed("e", &[("kg", 7), ("l", 1)]), false).await;
    assert!(
        e.flushed.is_empty(),
        "the sums kept the removed item's 3 kg"
    );

    // Litres alone now: c and e hold 2 l, f's 3 fit, g's 6 do not.
    let litres = with_capacity(&[("l", 6)]);
    let f = add(&store, &litres, weighed("f", &[("kg", 1), ("l", 3)]), false).await;
    assert!(f.flushed.is_empty(), "c and e hold 2 l");
    let g = add(&store, &litres, weighed("g", &[("kg", 1), ("l", 2)]), false).await;
    assert_eq!(ids(&g), [["c", "e", "f"]], "2 + 3 + 2 is past 6 l");
    let got: Vec<_> = g.flushed[0]
        .items
        .iter()
        .map(|i| i.measures.clone())
        .collect();
    let want = [("c", 2, 1), ("e", 7, 1), ("f", 1, 3)]
        .map(|(id, kg, l)| weighed(id, &[("kg", kg), ("l", l)]).measures);
    assert_eq!(got, want);
}

/// Adds one plain item `id` to `key` under `policy`.
async fn add_to(store: &Store, key: &str, policy: &Policy, id: &str) -> AddResult {
    let new = NewItem {
        key: key.into(),
        item: parcel(id, None),
        policy: policy.clone(),
        close: false,
        requeue_of: None,
    };
    store.add(vec![new]).await.expect("add").results.remove(0)
}

/// Every outcome and limit code the add function replies reads back as
/// what it means, through a real Redis: added, duplicate, refused by the
/// service's and by a policy's limit on open groups, and waiting for room
/// under each (which the store settles by an OVERFLOW flush of the group
/// the reply named).
#[tokio::test]
async fn every_add_outcome_crosses_to_its_rust_type() {
    let redis = RedisServer::start();
    let plain = Policy::basic(100, Duration::from_secs(600), None);
    let store = open(&redis, &plain);
    let keyspace = store.keyspace().clone();
    // Keys of one shard: a limit on open groups counts per shard.
    let keys: Vec<String> = (0..)
        .map(|n| format!("k{n}"))
        .filter(|key| keyspace.shard_of(key) == keyspace.shard_of("k0"))
        .take(5)
        .collect();
    let outcome = |r: &AddResult| (r.outcome.clone(), r.group_size);

    let added = add_to(&store, &keys[0], &plain, "a").await;
    assert_eq!(outcome(&added), (AddOutcome::Added, 1));
    let again = add_to(&store, &keys[0], &plain, "a").await;
    assert_eq!(outcome(&again), (AddOutcome::Duplicate, 1));

    // The service's limit: one open group per shard, counted from here.
    store.set_max_open_groups(u32::from(keyspace.shards()));
    add_to(&store, &keys[1], &plain, "b").await;
    let refused = add_to(&store, &keys[2], &plain, "c").await;
    assert_eq!(
        outcome(&refused),
        (AddOutcome::Refused(OpenLimit::Service), 0)
    );
    let oldest = Policy {
        overflow: Overflow::FlushOldest,
        ..plain.clone()
    };
    let waited = add_to(&store, &keys[2], &oldest, "c").await;
    assert_eq!(outcome(&waited), (AddOutcome::Added, 1));
    assert_eq!(reasons(&waited), [(keys[1].clone(), FlushReason::Overflow)]);
    store.set_max_open_groups(0);

    // A policy's own limit, by its scope.
    let scoped = Policy {
        max_groups: u32::from(keyspace.shards()),
        scope: Some("d".into()),
        ..plain.clone()
    };
    add_to(&store, &keys[3], &scoped, "d").await;
    let refused = add_to(&store, &keys[4], &scoped, "e").await;
    let by_policy = OpenLimit::Policy("d".into());
    assert_eq!(outcome(&refused), (AddOutcome::Refused(by_policy), 0));
    let oldest = Policy {
        overflow: Overflow::FlushOldest,
        ..scoped
    };
    let waited = add_to(&store, &keys[4], &oldest, "e").await;
    assert_eq!(outcome(&waited), (AddOutcome::Added, 1));
    assert_eq!(reasons(&waited), [(keys[3].clone(), FlushReason::Overflow)]);
}

/// The key and reason of each batch an add wrote.
fn reasons(result: &AddResult) -> Vec<(String, FlushReason)> {
    result
        .flushed
        .iter()
        .map(|b| (b.key.clone(), b.reason))
        .collect()
}
