//! Requeue and the delayed-queue recipe against a real Redis: items of a
//! delivered batch go back into their key's next batch, once per (batch,
//! item), past the dedup window; and one key per order with an item
//! deadline delivers the item at its deadline, or never once it is removed.

use crate::support::policy::{
    Client, due_by, group, ids, ms, now_ms, reason, start, subscribe_all, weighed,
};
use crate::support::{
    add, all_batches, assert_error_info, assert_invalid, config, next_batch, store,
};
use batcher::pb;
use pb::FlushReason;

/// Batches of 3 items, which only size flushes in these tests.
const LOADS: &str = "[defaults]\nmax_items = 3\nmax_wait = \"10m\"\n";

/// Requeues `item_ids` of batch `batch_id`.
async fn requeue(
    client: &mut Client,
    batch_id: &str,
    item_ids: &[&str],
) -> Result<pb::RequeueResponse, tonic::Status> {
    let req = pb::RequeueRequest {
        batch_id: batch_id.into(),
        item_ids: item_ids.iter().map(|id| id.to_string()).collect(),
    };
    client.requeue(req).await.map(tonic::Response::into_inner)
}

/// Adds a (weighing 5 g), b and c under `key`: the batch they flush (SIZE).
async fn first_load(client: &mut Client, key: &str) -> pb::Batch {
    let mut last = None;
    for (id, grams) in [("a", 5), ("b", 6), ("c", 7)] {
        let resp = client.add(weighed(key, id, &[("weight_g", grams)])).await;
        last = resp.expect("add").into_inner().flushed;
    }
    let batch = last.expect("the third item flushes");
    assert_eq!(reason(&batch), FlushReason::Size);
    batch
}

/// Requeued items come back in the key's next batch with their payload and
/// measures and requeue_count 1; a second identical Requeue requeues nothing.
#[tokio::test]
async fn requeued_items_return_in_the_next_batch() {
    let (_redis, service, mut client) = start(LOADS).await;
    let mut stream = subscribe_all(&mut client).await;
    let first = first_load(&mut client, "truck").await;
    assert_eq!(next_batch(&mut stream).await.id, first.id);

    let resp = requeue(&mut client, &first.id, &["c", "a"]).await.unwrap();
    assert_eq!((resp.requeued, resp.group_size), (2, 2));
    let again = requeue(&mut client, &first.id, &["c", "a"]).await.unwrap();
    assert_eq!((again.requeued, again.group_size), (0, 2));
    let open = group(&mut client, "truck").await.expect("open");
    assert_eq!(ids(&open.items), ["a", "c"], "in the batch's order");

    let resp = client.add(weighed("truck", "d", &[])).await.unwrap();
    let flushed = resp.into_inner().flushed.expect("d completes the group");
    let next = next_batch(&mut stream).await;
    assert_eq!(next.id, flushed.id);
    assert_eq!(ids(&next.items), ["a", "c", "d"]);
    let counts: Vec<u32> = next.items.iter().map(|i| i.requeue_count).collect();
    assert_eq!(counts, [1, 1, 0]);
    for (got, was) in next.items[..2]
        .iter()
        .zip([&first.items[0], &first.items[2]])
    {
        assert_eq!((&got.payload, &got.measures), (&was.payload, &was.measures));
    }
    // Still nothing to requeue once the requeued items were delivered again.
    let late = requeue(&mut client, &first.id, &["a"]).await.unwrap();
    assert_eq!((late.requeued, late.group_size), (0, 0));
    service.stop().await;
}

/// An id that is not in the batch is INVALID_ARGUMENT naming item_ids[i],
/// and nothing is requeued.
#[tokio::test]
async fn requeue_refuses_an_id_not_in_the_batch() {
    let (_redis, service, mut client) = start(LOADS).await;
    let first = first_load(&mut client, "truck").await;
    let status = requeue(&mut client, &first.id, &["a", "zz"])
        .await
        .unwrap_err();
    assert_invalid(&status, "item_ids[1]");
    assert!(group(&mut client, "truck").await.is_none());
    // The refused call requeued nothing: a is still requeued once now.
    let resp = requeue(&mut client, &first.id, &["a"]).await.unwrap();
    assert_eq!(resp.requeued, 1);
    service.stop().await;
}

/// A batch id of the right shape that no batch has is NOT_FOUND with
/// ErrorInfo reason BATCH_NOT_FOUND.
#[tokio::test]
async fn requeue_of_an_unknown_batch_is_not_found() {
    let (_redis, service, mut client) = start(LOADS).await;
    first_load(&mut client, "truck").await;
    let status = requeue(&mut client, "0-1-0", &["a"]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert_error_info(&status, "BATCH_NOT_FOUND");
    assert!(group(&mut client, "truck").await.is_none());
    service.stop().await;
}

/// Requeue bypasses the dedup window for exactly the ids it names: a plain
/// re-add of a delivered id is DUPLICATE before and after, but Requeue puts
/// it back.
#[tokio::test]
async fn requeue_bypasses_the_dedup_window_for_its_ids_only() {
    let (_redis, service, mut client) = start(LOADS).await;
    let first = first_load(&mut client, "truck").await;
    let duplicate = pb::AddOutcome::Duplicate as i32;
    let resp = client.add(add("truck", "a", b"a")).await.unwrap();
    assert_eq!(resp.into_inner().outcome, duplicate);

    let resp = requeue(&mut client, &first.id, &["a"]).await.unwrap();
    assert_eq!((resp.requeued, resp.group_size), (1, 1));
    for id in ["a", "b"] {
        let resp = client
            .add(add("truck", id, b""))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((resp.outcome, resp.group_size), (duplicate, 1), "{id}");
    }
    let open = group(&mut client, "truck").await.expect("open");
    assert_eq!(ids(&open.items), ["a"]);
    assert_eq!(open.items[0].requeue_count, 1);
    service.stop().await;
}

/// The delayed-queue recipe of docs/policies.md.
const ORDERS: &str = r#"
[defaults]
max_items = 100
max_wait = "10m"

[keys."unpaid:*"]
max_items = 2
max_wait = "1h"
"#;

/// Adds the cancellation item of `order`, due at `deadline` (ms).
async fn unpaid(client: &mut Client, order: &str, deadline: i64) {
    let req = due_by(weighed(&format!("unpaid:{order}"), "cancel", &[]), deadline);
    let resp = client.add(req).await.expect("add").into_inner();
    assert_eq!(resp.outcome, pb::AddOutcome::Added as i32);
    assert!(resp.batches.is_empty(), "{resp:?}");
}

/// The delayed-queue recipe: one key per order and an item with a deadline.
/// The item is delivered at its deadline (DEADLINE), not before; an order
/// whose item is removed before its deadline is never delivered.
#[tokio::test]
async fn delayed_queue_delivers_at_the_deadline_and_never_once_removed() {
    let (redis, service, mut client) = start(ORDERS).await;
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            key_prefixes: vec!["unpaid:".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let deadline = now_ms() + 2000;
    unpaid(&mut client, "1001", deadline).await;
    unpaid(&mut client, "1002", deadline).await;
    // Order 1002 is paid: its cancellation is removed.
    let paid = pb::RemoveRequest {
        key: "unpaid:1002".into(),
        item_id: "cancel".into(),
    };
    let resp = client.remove(paid).await.unwrap().into_inner();
    assert!(resp.removed && resp.group_size == 0, "{resp:?}");
    // A sentinel order due well after 1002's deadline.
    let sentinel = deadline + 1500;
    unpaid(&mut client, "1003", sentinel).await;

    let batch = next_batch(&mut stream).await;
    assert_eq!(
        (batch.key.as_str(), reason(&batch)),
        ("unpaid:1001", FlushReason::Deadline)
    );
    assert_eq!(ids(&batch.items), ["cancel"]);
    assert!(
        ms(&batch.flushed_at) >= deadline,
        "delivered before its deadline"
    );
    assert_eq!(ms(&batch.items[0].deadline), deadline);
    // The next delivery is the sentinel, flushed after 1002's deadline
    // passed, and 1002 was never flushed at all.
    let batch = next_batch(&mut stream).await;
    assert_eq!(
        (batch.key.as_str(), reason(&batch)),
        ("unpaid:1003", FlushReason::Deadline)
    );
    assert!(ms(&batch.flushed_at) >= sentinel);
    let keys: Vec<String> = all_batches(&store(&config(&redis.url(), ORDERS)))
        .await
        .into_iter()
        .map(|b| b.key)
        .collect();
    assert!(!keys.contains(&"unpaid:1002".to_owned()), "{keys:?}");
    assert!(group(&mut client, "unpaid:1002").await.is_none());
    service.stop().await;
}
