//! The add function's paths agree: parcels under every rule that holds still
//! get the same answers whether each call brings a group one item (the
//! ruled path, `src/lua/add_ruled.lua`) or several (the general path).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use batcher::batch::{AddOutcome, AddResult, FlushReason, Item};
use batcher::policy::Policy;
use batcher::store::NewItem;

use crate::policy_scripts::open;
use crate::support::RedisServer;

/// Parcels under every rule that holds still (capacity by two measures,
/// deadlines, min_items, max_idle, max_age), added one to a call (one item
/// per group: the ruled path) and twelve to a call over three keys (most
/// groups several items: the general path), get the same answers: each
/// add's outcome, size and batches (ids, reason, measures), and the groups
/// left open with their sizes, sums and due rules.
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
    let (one, many) = (RedisServer::start(), RedisServer::start());
    let (one, many) = (open(&one, &policy), open(&many, &policy));
    let mut answers = [Vec::new(), Vec::new()];
    for item in &items {
        let mut report = one.add(vec![item.clone()]).await.expect("add");
        answers[0].push(report.results.remove(0));
    }
    for call in items.chunks(12) {
        answers[1].extend(many.add(call.to_vec()).await.expect("add").results);
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
    let (a, b) = (summary(&answers[0]), summary(&answers[1]));
    for (n, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_eq!(a, b, "add {n}: {:?}", items[n].item.id);
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
    for key in ["area-0", "area-1", "area-2"] {
        let (x, y) = (
            one.group(key).await.unwrap(),
            many.group(key).await.unwrap(),
        );
        let view = |g: &Option<batcher::batch::Group>| {
            g.as_ref().map(|g| {
                let ids: Vec<_> = g.items.iter().map(|i| i.id.clone()).collect();
                let due = match g.due_reason {
                    FlushReason::Deadline => g.due_at_ms,
                    FlushReason::Idle => g.due_at_ms - g.last_added_ms,
                    _ => g.due_at_ms - g.opened_at_ms,
                };
                (g.size, g.bytes, g.measures.clone(), g.due_reason, due, ids)
            })
        };
        assert_eq!(view(&x), view(&y), "{key}");
    }
}
