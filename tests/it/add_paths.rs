//! The add function's paths agree: parcels under every rule that holds still
//! get the same answers whether each call brings a group one item (the
//! ruled path, `src/lua/add_ruled.lua`) or several (the ruled path while
//! they fit the group, else the general path); and
//! AddMany answers in request order whichever path a shard's call takes
//! (groups of several items, and the lead of groups given one).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use batcher::batch::{AddOutcome, AddResult, FlushReason, Item};
use batcher::policy::Policy;
use batcher::store::NewItem;

use batcher::pb;

use crate::api::setup;
use crate::policy_scripts::open;
use crate::support::{RedisServer, add, add_many};

/// Parcels under every rule that holds still (capacity by two measures,
/// deadlines, min_items, max_idle, max_age), added one to a call (one item
/// per group: the ruled path), six to a call over three keys (groups of
/// about two items: the ruled path while they fit) and twelve (about four:
/// mostly the general path), get the same answers: each add's outcome,
/// size and batches (ids, reason, measures), and the groups left open with
/// their sizes, sums and due rules.
#[tokio::test]
async fn one_item_calls_and_many_item_calls_agree_under_every_rule() {
    use rand::{Rng, SeedableRng};
    let policy = Policy {
        capacity: Arc::new(BTreeMap::from([
            ("kg".to_owned(), 20),
            ("l".to_owned(), 30),
        ])),
        max_idle: Some(Duration::from_secs(1800)),
        deadline_lead: Duration::from_secs(300),
        min_items: 3,
        max_age: Some(Duration::from_secs(7200)),
        ..Policy::basic(6, Duration::from_secs(3600), None)
    };
    let now = crate::support::policy::now_ms() as u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let items: Vec<NewItem> = (0..360)
        .map(|_| {
            let mut item = Item::new(format!("p{}", rng.random_range(0..150)), b"parcel".to_vec());
            if rng.random_bool(0.9) {
                item.measures.insert("kg".into(), rng.random_range(1..8));
            }
            if rng.random_bool(0.8) {
                item.measures.insert("l".into(), rng.random_range(1..12));
            }
            if rng.random_bool(0.15) {
                item.deadline_ms = Some(now + rng.random_range(600_000..1_200_000));
            }
            NewItem {
                key: format!("area-{}", rng.random_range(0..3)),
                item,
                policy: policy.clone(),
                close: false,
                requeue_of: None,
            }
        })
        .collect();
    let servers = [(); 3].map(|_| RedisServer::start());
    let stores: Vec<_> = servers.iter().map(|s| open(s, &policy)).collect();
    let mut answers = [Vec::new(), Vec::new(), Vec::new()];
    // Every twelve items, where all three sides end a call, their groups
    // agree, and the due set wakes the sweeper no later than each is due.
    for (at, chunk) in items.chunks(12).enumerate() {
        for (side, per_call) in [1, 6, 12].into_iter().enumerate() {
            for call in chunk.chunks(per_call) {
                let report = stores[side].add(call.to_vec()).await.expect("add");
                answers[side].extend(report.results);
            }
        }
        for key in ["area-0", "area-1", "area-2"] {
            let mut views = Vec::new();
            for (store, server) in stores.iter().zip(&servers) {
                views.push(group_view(store, server, key).await);
            }
            assert_eq!(
                views[0],
                views[1],
                "{key} after {} items, 6 a call",
                12 * (at + 1)
            );
            assert_eq!(
                views[0],
                views[2],
                "{key} after {} items, 12 a call",
                12 * (at + 1)
            );
        }
    }
    let summary = |results: &[AddResult]| -> Vec<_> {
        results
            .iter()
            .map(|r| {
                let batches: Vec<_> = r
                    .flushed
                    .iter()
                    .map(|b| {
                        let items: Vec<_> = b
                            .items
                            .iter()
                            .map(|i| (i.id.clone(), i.measures.clone()))
                            .collect();
                        (b.reason, items)
                    })
                    .collect();
                (r.outcome.clone(), r.group_size, batches)
            })
            .collect()
    };
    let a = summary(&answers[0]);
    for (side, per_call) in [(1, 6), (2, 12)] {
        let b = summary(&answers[side]);
        assert_eq!(a.len(), b.len(), "answers at 1 and {per_call} a call");
        assert_eq!(a.len(), items.len(), "one answer per item");
        for (n, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(a, b, "add {n} at {per_call} a call: {:?}", items[n].item.id);
        }
    }
    let reasons: Vec<FlushReason> = a.iter().flat_map(|r| r.2.iter().map(|b| b.0)).collect();
    for reason in [FlushReason::Size, FlushReason::Capacity] {
        assert!(
            reasons.contains(&reason),
            "no {reason:?} flush: {reasons:?}"
        );
    }
    assert!(
        a.iter().any(|r| r.0 == AddOutcome::Duplicate),
        "no duplicate"
    );
}

/// Group `key` of `store` as the paths must leave it alike: its size,
/// bytes, sums, due reason and due time (relative to what it follows) and
/// ids; and asserts that the due set holds it no later than it is due.
async fn group_view(
    store: &batcher::store::Store,
    server: &RedisServer,
    key: &str,
) -> Option<impl PartialEq + std::fmt::Debug> {
    let g = store.group(key).await.unwrap()?;
    let keyspace = batcher::keys::Keyspace::new("pol", 4);
    let due_set = keyspace.shard(keyspace.shard_of(key)).due;
    let score: u64 = server
        .cli(&["ZSCORE", &due_set, key])
        .trim()
        .parse()
        .unwrap();
    assert!(
        score <= g.due_at_ms,
        "{key} is due at {} ({:?}) but the due set has {score}",
        g.due_at_ms,
        g.due_reason
    );
    let ids: Vec<_> = g.items.iter().map(|i| i.id.clone()).collect();
    let due = match g.due_reason {
        FlushReason::Deadline => g.due_at_ms,
        FlushReason::Idle => g.due_at_ms - g.last_added_ms,
        _ => g.due_at_ms - g.opened_at_ms,
    };
    Some((g.size, g.bytes, g.measures.clone(), g.due_reason, due, ids))
}

/// AddMany returns results in request order, flushing groups as they fill, across shards.
#[tokio::test]
async fn add_many_results_in_request_order() {
    let (_redis, service, mut client) = setup().await;
    let mut items = Vec::new();
    for i in 0..7 {
        for key in ["a", "b", "c", "d", "e"] {
            items.push(add(key, &i.to_string(), key.as_bytes()));
        }
    }
    let results = add_many(&mut client, items.clone()).await;
    assert_eq!(results.len(), items.len());
    for (req, resp) in items.iter().zip(&results) {
        let i: u32 = req.item.as_ref().unwrap().id.parse().unwrap();
        // max_items is 3: ids 2 and 5 complete a batch.
        let expected_size = (i + 1) % 3;
        assert_eq!(resp.group_size, expected_size, "key {} id {i}", req.key);
        assert_eq!(resp.flushed.is_some(), expected_size == 0);
        if let Some(batch) = &resp.flushed {
            assert_eq!(batch.key, req.key);
            assert_eq!(batch.items.len(), 3);
        }
    }
    service.stop().await;
}

/// AddMany answers each item in request order when a shard's call takes the
/// groups given one item ahead of the others (the lead): fills, flushes of
/// groups opened before and duplicates land on the items they belong to.
#[tokio::test]
async fn add_many_results_in_request_order_when_single_item_groups_lead() {
    let (_redis, service, mut client) = setup().await;
    // Groups one item short of max_items (3), and an id already flushed.
    for j in 0..12 {
        for id in ["a", "b"] {
            client.add(add(&format!("k{j}"), id, b"")).await.unwrap();
        }
    }
    for id in ["x", "y", "z"] {
        client.add(add("dup", id, b"")).await.unwrap();
    }
    // Per item: its key, id, the group size after it, and the ids of the
    // batch it flushes (empty: none), or None for a duplicate.
    type Added = Option<(u32, Vec<&'static str>)>;
    let mut expected: Vec<(String, String, Added)> = Vec::new();
    for j in 0..12 {
        let (m, k, s) = (format!("m{j}"), format!("k{j}"), format!("s{j}"));
        expected.push((m.clone(), "1".into(), Some((1, vec![]))));
        expected.push((k, "c".into(), Some((0, vec!["a", "b", "c"]))));
        expected.push((s, "1".into(), Some((1, vec![]))));
        expected.push((m, "2".into(), Some((2, vec![]))));
        if j == 5 {
            expected.push(("dup".into(), "y".into(), None));
        }
    }
    let items: Vec<_> = (expected.iter())
        .map(|(key, id, _)| add(key, id, b"p"))
        .collect();
    let results = add_many(&mut client, items).await;
    assert_eq!(results.len(), expected.len());
    for ((key, id, want), got) in expected.iter().zip(&results) {
        match want {
            None => {
                assert_eq!(got.outcome, pb::AddOutcome::Duplicate as i32, "{key}/{id}");
            }
            Some((size, batch)) => {
                assert_eq!(got.outcome, pb::AddOutcome::Added as i32, "{key}/{id}");
                assert_eq!(got.group_size, *size, "{key}/{id}");
                let ids: Vec<&str> = (got.flushed.iter())
                    .flat_map(|b| b.items.iter().map(|i| i.id.as_str()))
                    .collect();
                assert_eq!(&ids, batch, "{key}/{id}");
                if let Some(b) = &got.flushed {
                    assert_eq!(&b.key, key);
                }
            }
        }
    }
    service.stop().await;
}

/// A call of the most items AddMany takes by default (10,000), all of one
/// shard, comes back whole: every item's answer, whether it fills one group
/// of max_items 10,000 (one batch, of all of them, by the last) or writes a
/// batch every ten items.
#[tokio::test]
async fn a_call_of_ten_thousand_items_to_one_shard_answers_every_item() {
    let redis = RedisServer::start();
    let roomy = Policy::basic(10_000, Duration::from_secs(3600), None);
    let store = open(&redis, &roomy);
    let call = |key: &str, policy: &Policy| -> Vec<NewItem> {
        (0..10_000)
            .map(|n| NewItem {
                key: key.into(),
                item: Item::new(format!("{key}-{n}"), b"p".to_vec()),
                policy: policy.clone(),
                close: false,
                requeue_of: None,
            })
            .collect()
    };
    let report = store.add(call("wide", &roomy)).await.expect("one group");
    assert_eq!(report.results.len(), 10_000);
    assert!(
        report
            .results
            .iter()
            .all(|r| r.outcome == AddOutcome::Added)
    );
    assert_eq!(report.results[9_998].group_size, 9_999);
    assert!(report.results[..9_999].iter().all(|r| r.flushed.is_empty()));
    let whole = &report.results[9_999].flushed;
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].items.len(), 10_000);
    assert_eq!(whole[0].items[4_321].id, b"wide-4321");

    let tens = Policy::basic(10, Duration::from_secs(3600), None);
    let report = store.add(call("tens", &tens)).await.expect("1,000 batches");
    assert_eq!(report.results.len(), 10_000);
    let flushed: Vec<usize> = report
        .results
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.flushed.is_empty())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(flushed.len(), 1_000);
    assert!(flushed.iter().all(|n| n % 10 == 9));
    let last = &report.results[9_999].flushed[0];
    assert_eq!(last.items.len(), 10);
    assert_eq!(last.items[9].id, b"tens-9999");
}

/// A call of ten thousand items leaves the library's Lua heap small: the
/// add function sheds the arrays such a call grew (7 to 11 MB of heap
/// before it did) rather than keeping them for every later call.
#[tokio::test]
async fn a_call_of_ten_thousand_items_leaves_the_lua_heap_small() {
    let redis = RedisServer::start();
    let tens = Policy::basic(10, Duration::from_secs(3600), None);
    let store = open(&redis, &tens);
    let items = (0..10_000)
        .map(|n| NewItem {
            key: "wide".into(),
            item: Item::new(format!("parcel-{n}"), b"p".to_vec()),
            policy: tens.clone(),
            close: false,
            requeue_of: None,
        })
        .collect();
    let report = store.add(items).await.expect("1,000 batches");
    assert_eq!(report.results.len(), 10_000);
    let memory = redis.cli(&["info", "memory"]);
    let heap: u64 = memory
        .lines()
        .find_map(|l| l.strip_prefix("used_memory_vm_functions:"))
        .expect("INFO memory gives used_memory_vm_functions")
        .trim()
        .parse()
        .expect("a byte count");
    assert!(
        heap < 4 << 20,
        "the functions' Lua heap holds {heap} bytes after the call"
    );
}

/// A group opened under a limit on open groups, whose policy a reload
/// then made usual (no limit), leaves the open-group index when a usual
/// add fills it: the usual path's flush takes it out of the index, so the
/// limit counts only open groups.
#[tokio::test]
async fn a_group_opened_under_a_limit_leaves_the_index_when_a_usual_add_flushes_it() {
    let limited = Policy {
        max_groups: 100,
        scope: Some("area-*".into()),
        ..Policy::basic(3, Duration::from_secs(3600), None)
    };
    let usual = Policy::basic(3, Duration::from_secs(3600), None);
    let redis = RedisServer::start();
    let store = open(&redis, &limited);
    let add = |id: &str, policy: &Policy| NewItem {
        key: "area-1".into(),
        item: Item::new(id, b"p".to_vec()),
        policy: policy.clone(),
        close: false,
        requeue_of: None,
    };
    store.add(vec![add("a", &limited)]).await.expect("add");
    assert_eq!(
        indexed(&store, "area-*").await,
        1,
        "the group is in the index"
    );
    let report = store
        .add(vec![add("b", &usual), add("c", &usual)])
        .await
        .expect("add");
    assert_eq!(
        report.results[1].flushed.len(),
        1,
        "the third item filled the group"
    );
    let ids: Vec<_> = report.results[1].flushed[0]
        .items
        .iter()
        .map(|i| i.id.clone())
        .collect();
    assert_eq!(ids, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        indexed(&store, "area-*").await,
        0,
        "the flushed group left the index"
    );
}

/// The groups open in `scope`'s part of the open-group index.
async fn indexed(store: &batcher::store::Store, scope: &str) -> u64 {
    let stats = store.open_limit_stats(&[scope]).await.expect("stats");
    stats.per_scope[0]
}
