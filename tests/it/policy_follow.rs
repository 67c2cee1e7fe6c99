//! How a policy change reaches what it governs: open groups follow a shorter
//! max_wait (not a longer one) and a lower max_items, and a key policy's
//! change moves only its own key, on every instance.

use batcher::pb;

use crate::policy_store::{Client, get, max_items_in_force, one, secs, store_on, update};
use crate::support::{RedisServer, Service, add, eventually, next_batch};

/// How long after its opening `key`'s open group is due, in ms.
async fn due_after_open(client: &Client, key: &str) -> i64 {
    let mut c = client.clone();
    let req = pb::GetGroupRequest { key: key.into() };
    let g = c.get_group(req).await.unwrap().into_inner().group.unwrap();
    let ms = |t: Option<prost_types::Timestamp>| {
        let t = t.unwrap();
        t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
    };
    ms(g.due_at) - ms(g.opened_at)
}

/// A shorter max_wait moves an open group's due time to its opening plus
/// the new window, and the group flushes then; a longer one leaves open
/// groups as they are and applies to groups opened after it.
#[tokio::test]
async fn open_groups_follow_a_shorter_max_wait_not_a_longer_one() {
    let (_redis, service, mut client) = one("[defaults]\nmax_wait = \"10m\"\n").await;
    let mut live = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    client.add(add("dock-1", "a", b"")).await.unwrap();
    assert_eq!(due_after_open(&client, "dock-1").await, 600_000);

    // 5 s: long enough for the read below to come first on a busy machine.
    let shorter = pb::Policy {
        max_wait: secs(5),
        ..Default::default()
    };
    client
        .update_policy(update("defaults", shorter, &["max_wait"], ""))
        .await
        .unwrap();
    // In force when the call returns: the group is due 5 s after it opened.
    assert_eq!(due_after_open(&client, "dock-1").await, 5_000);
    let batch = next_batch(&mut live).await;
    assert_eq!(batch.key, "dock-1");
    assert_eq!(batch.reason, pb::FlushReason::Timeout as i32);

    // A window the group outlives, whatever the machine's pace.
    let minutes = pb::Policy {
        max_wait: secs(120),
        ..Default::default()
    };
    client
        .update_policy(update("defaults", minutes, &["max_wait"], ""))
        .await
        .unwrap();
    client.add(add("dock-2", "b", b"")).await.unwrap();
    let longer = pb::Policy {
        max_wait: secs(3600),
        ..Default::default()
    };
    client
        .update_policy(update("defaults", longer, &["max_wait"], ""))
        .await
        .unwrap();
    assert_eq!(due_after_open(&client, "dock-2").await, 120_000);
    client.add(add("dock-3", "c", b"")).await.unwrap();
    assert_eq!(due_after_open(&client, "dock-3").await, 3_600_000);
    service.stop().await;
}

/// Changes of single key policies, each put in force on its own, leave
/// every other key's policy as it was, on the instance that made them and
/// on one that replays them; a key's shorter max_wait moves its open group
/// before the call returns, and a deleted key falls back to its glob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_changes_move_only_their_keys_on_every_instance() {
    let redis = RedisServer::start();
    let text = store_on(
        "[keys.\"dock-*\"]\nmax_items = 30\n\
         [keys.\"dock-1\"]\nmax_items = 10\nmax_wait = \"10m\"\n\
         [keys.\"dock-2\"]\nmax_items = 20\n",
    );
    let config = crate::support::config(&redis.url(), &text);
    let (a, b) = (
        Service::start(config.clone()).await,
        Service::start(config).await,
    );
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for client in [&mut ca, &mut cb] {
        let ready = eventually("the store to load", || {
            let mut c = client.clone();
            async move { c.add(add("dock-1", "a", b"")).await.ok() }
        });
        ready.await;
    }
    assert_eq!(due_after_open(&ca, "dock-1").await, 600_000);

    let shorter = pb::Policy {
        max_wait: secs(300),
        ..Default::default()
    };
    let req = update("keys/dock-1", shorter, &["max_wait"], "");
    let changed = ca.update_policy(req).await.unwrap().into_inner();
    // In force on `a` when the call returns, its group moved with it.
    assert_eq!(due_after_open(&ca, "dock-1").await, 300_000);
    // `b` replays it: its view of the store reaches the revision.
    let replayed = eventually("the change on the other instance", || {
        let mut c = cb.clone();
        let want = changed.revision;
        async move { (get(&mut c, "keys/dock-1").await.revision == want).then_some(()) }
    });
    replayed.await;
    for client in [&mut ca, &mut cb] {
        assert_eq!(max_items_in_force(client, "dock-1").await, 10);
        assert_eq!(max_items_in_force(client, "dock-2").await, 20);
        assert_eq!(max_items_in_force(client, "dock-3").await, 30);
    }

    let delete = pb::DeletePolicyRequest {
        name: "policies/keys/dock-2".into(),
        ..Default::default()
    };
    ca.delete_policy(delete).await.unwrap();
    for client in [&mut ca, &mut cb] {
        let fell_back = eventually("dock-2 under its glob", || {
            let mut c = client.clone();
            async move { (max_items_in_force(&mut c, "dock-2").await == 30).then_some(()) }
        });
        fell_back.await;
        assert_eq!(max_items_in_force(client, "dock-1").await, 10);
    }
    a.stop().await;
    b.stop().await;
}

/// Lowering max_items below an open group's size cuts the group at its
/// next add, into batches of the new max_items.
#[tokio::test]
async fn lowering_max_items_cuts_an_open_group_at_its_next_add() {
    let (_redis, service, mut client) = one("[defaults]\nmax_items = 10\n").await;
    for id in ["a", "b", "c", "d", "e"] {
        client.add(add("dock", id, b"")).await.unwrap();
    }
    let lower = pb::Policy {
        max_items: Some(2),
        ..Default::default()
    };
    client
        .update_policy(update("defaults", lower, &["max_items"], ""))
        .await
        .unwrap();
    let resp = client
        .add(add("dock", "f", b""))
        .await
        .unwrap()
        .into_inner();
    let sizes: Vec<usize> = resp.batches.iter().map(|b| b.items.len()).collect();
    assert_eq!(sizes, [2, 2, 2]);
    let reasons = resp.batches.iter().map(|b| b.reason);
    assert!(
        reasons
            .into_iter()
            .all(|r| r == pb::FlushReason::Size as i32)
    );
    assert_eq!(resp.group_size, 0);
    service.stop().await;
}
