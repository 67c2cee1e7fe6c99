//! The API's semantics against a real Redis: size and bytes flushes, manual
//! flush, remove, idempotency, per-key policies, group reads and validation.

use crate::support;

use crate::support::{RedisServer, Service, add, all_batches, assert_invalid, config, store};
use batcher::pb;

const POLICIES: &str = r#"
[defaults]
max_items = 3
max_wait = "10m"

[keys."north"]
max_items = 5

[keys."south-*"]
max_items = 2

[keys."south-big-*"]
max_items = 4

[keys."bytes"]
max_items = 100
max_bytes = "10B"

[keys."long"]
max_items = 1000
"#;

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

/// A Redis of its own and a service on it under [`POLICIES`], and a client.
pub(crate) async fn setup() -> (RedisServer, Service, Client) {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), POLICIES)).await;
    let client = service.client().await;
    (redis, service, client)
}

/// Removes item `id` from `key`'s open group.
async fn remove(client: &mut Client, key: &str, id: &str) -> pb::RemoveResponse {
    let request = pb::RemoveRequest {
        key: key.into(),
        item_id: id.into(),
    };
    client.remove(request).await.unwrap().into_inner()
}

/// The add that brings a group to max_items flushes it, atomically, with reason SIZE.
#[tokio::test]
async fn size_threshold_flushes_in_the_completing_add() {
    let (_redis, service, mut client) = setup().await;
    for (i, expected_size) in [(1, 1), (2, 2)] {
        let resp = client
            .add(add("k", &format!("i{i}"), b"p"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.outcome, pb::AddOutcome::Added as i32);
        assert_eq!(resp.group_size, expected_size);
        assert!(resp.flushed.is_none());
    }
    let resp = client
        .add(add("k", "i3", b"p3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.group_size, 0);
    let batch = resp.flushed.expect("the third add flushes");
    assert_eq!(batch.reason, pb::FlushReason::Size as i32);
    assert_eq!(batch.key, "k");
    let ids: Vec<_> = batch.items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, ["i1", "i2", "i3"]);
    assert_eq!(batch.items[2].payload, b"p3");
    assert!(batch.opened_at.unwrap().seconds <= batch.flushed_at.unwrap().seconds);
    // The group is gone and the next add opens a new one.
    let got = client
        .get_group(pb::GetGroupRequest { key: "k".into() })
        .await
        .unwrap();
    assert!(got.into_inner().group.is_none());
    let resp = client.add(add("k", "i4", b"p")).await.unwrap().into_inner();
    assert_eq!(resp.group_size, 1);
    // The stream holds exactly that one batch.
    let batches = all_batches(&store(&config(&_redis.url(), POLICIES))).await;
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].id(), batch.id);
    service.stop().await;
}

/// Policies resolve per key: exact beats glob, longer glob beats shorter, unset fields from defaults.
#[tokio::test]
async fn policies_apply_per_key() {
    let (_redis, service, mut client) = setup().await;
    for (key, expected) in [
        ("north", 5),
        ("south-1", 2),
        ("south-big-1", 4),
        ("east", 3),
    ] {
        let mut flushed_at = None;
        for i in 1..=expected {
            let resp = client
                .add(add(key, &i.to_string(), b""))
                .await
                .unwrap()
                .into_inner();
            if resp.flushed.is_some() {
                flushed_at = Some(i);
                break;
            }
        }
        assert_eq!(flushed_at, Some(expected), "key {key}");
    }
    client.add(add("south-x", "a", b"")).await.unwrap();
    let group = client
        .get_group(pb::GetGroupRequest {
            key: "south-x".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    assert_eq!(group.max_items, 2);
    assert_eq!(
        group.max_wait.unwrap().seconds,
        600,
        "max_wait comes from [defaults]"
    );
    service.stop().await;
}

/// The add whose payload bytes reach max_bytes flushes the group with reason BYTES.
#[tokio::test]
async fn bytes_threshold_flushes() {
    let (_redis, service, mut client) = setup().await;
    let resp = client
        .add(add("bytes", "a", b"123456"))
        .await
        .unwrap()
        .into_inner();
    assert!(resp.flushed.is_none());
    let resp = client
        .add(add("bytes", "b", b"1234"))
        .await
        .unwrap()
        .into_inner();
    let batch = resp.flushed.expect("10 bytes reach max_bytes");
    assert_eq!(batch.reason, pb::FlushReason::Bytes as i32);
    assert_eq!(batch.items.len(), 2);
    service.stop().await;
}

/// Re-adding an id is DUPLICATE while the group is open and after it flushed, and never lands in a second batch.
#[tokio::test]
async fn adds_are_idempotent_per_key_and_id() {
    let (redis, service, mut client) = setup().await;
    client.add(add("k", "a", b"1")).await.unwrap();
    let dup = client
        .add(add("k", "a", b"other"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dup.outcome, pb::AddOutcome::Duplicate as i32);
    assert_eq!(dup.group_size, 1);
    // The same id under another key is a different item.
    let other = client.add(add("k2", "a", b"1")).await.unwrap().into_inner();
    assert_eq!(other.outcome, pb::AddOutcome::Added as i32);

    client.add(add("k", "b", b"")).await.unwrap();
    let flushed = client.add(add("k", "c", b"")).await.unwrap().into_inner();
    assert!(flushed.flushed.is_some());
    // A retry of an add whose reply was lost, after the flush.
    for id in ["a", "b", "c"] {
        let retry = client.add(add("k", id, b"")).await.unwrap().into_inner();
        assert_eq!(retry.outcome, pb::AddOutcome::Duplicate as i32, "id {id}");
        assert_eq!(retry.group_size, 0);
    }
    // Within one AddMany call too.
    let many = client
        .add_many(pb::AddManyRequest {
            items: vec![add("k", "d", b""), add("k", "d", b""), add("k", "a", b"")],
        })
        .await
        .unwrap()
        .into_inner();
    let outcomes: Vec<i32> = many.results.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            pb::AddOutcome::Added as i32,
            pb::AddOutcome::Duplicate as i32,
            pb::AddOutcome::Duplicate as i32
        ]
    );
    let batches = all_batches(&store(&config(&redis.url(), POLICIES))).await;
    let total: usize = batches.iter().map(|b| b.items.len()).sum();
    assert_eq!(total, 3, "one batch of a, b, c and nothing else");
    service.stop().await;
}

/// A flushed id is accepted again once the dedup window has passed.
#[tokio::test]
async fn dedup_window_expires() {
    let redis = RedisServer::start();
    let extra = format!("{POLICIES}\n[dedup]\nwindow = \"300ms\"\n");
    let service = Service::start(config(&redis.url(), &extra)).await;
    let mut client = service.client().await;
    client.add(add("k", "a", b"")).await.unwrap();
    client
        .flush(pb::FlushRequest { key: "k".into() })
        .await
        .unwrap();
    let retry = client.add(add("k", "a", b"")).await.unwrap().into_inner();
    assert_eq!(retry.outcome, pb::AddOutcome::Duplicate as i32);
    support::eventually("the dedup window to pass", || {
        let mut client = client.clone();
        async move {
            let resp = client.add(add("k", "a", b"")).await.unwrap().into_inner();
            (resp.outcome == pb::AddOutcome::Added as i32).then_some(())
        }
    })
    .await;
    service.stop().await;
}

/// Remove takes an item out of its open group; the emptied group is gone.
#[tokio::test]
async fn remove_takes_items_out() {
    let (_redis, service, mut client) = setup().await;
    client.add(add("north", "a", b"12")).await.unwrap();
    client.add(add("north", "b", b"345")).await.unwrap();
    client.add(add("north", "empty", b"")).await.unwrap();
    let removed = remove(&mut client, "north", "empty").await;
    assert!(
        removed.removed,
        "an item with an empty payload can be removed"
    );
    let removed = remove(&mut client, "north", "a").await;
    assert!(removed.removed);
    assert_eq!(removed.group_size, 1);
    let group = client
        .get_group(pb::GetGroupRequest {
            key: "north".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    assert_eq!(group.size, 1);
    assert_eq!(group.bytes, 3);
    assert_eq!(group.items.len(), 1);
    let again = remove(&mut client, "north", "a").await;
    assert!(!again.removed);
    let last = remove(&mut client, "north", "b").await;
    assert!(last.removed);
    assert_eq!(last.group_size, 0);
    let gone = client
        .get_group(pb::GetGroupRequest {
            key: "north".into(),
        })
        .await
        .unwrap();
    assert!(gone.into_inner().group.is_none());
    let listed = client
        .list_groups(pb::ListGroupsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.groups.is_empty() && listed.next_page_token.is_empty(),
        "the emptied group left no due entry"
    );
    service.stop().await;
}

/// Flush forces a MANUAL batch now; with no open group the batch is unset.
#[tokio::test]
async fn manual_flush() {
    let (_redis, service, mut client) = setup().await;
    let none = client
        .flush(pb::FlushRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(none.batch.is_none());
    client.add(add("k", "a", b"x")).await.unwrap();
    let batch = client
        .flush(pb::FlushRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner()
        .batch
        .expect("a batch");
    assert_eq!(batch.reason, pb::FlushReason::Manual as i32);
    assert_eq!(batch.items.len(), 1);
    let again = client
        .flush(pb::FlushRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(again.batch.is_none());
    service.stop().await;
}

/// GetGroup reports the group with items in arrival order and due = opened + max_wait.
#[tokio::test]
async fn get_group_reports_the_open_group() {
    let (_redis, service, mut client) = setup().await;
    for id in ["z", "a", "m", "b"] {
        client.add(add("north", id, id.as_bytes())).await.unwrap();
    }
    let group = client
        .get_group(pb::GetGroupRequest {
            key: "north".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    let ids: Vec<&str> = group.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["z", "a", "m", "b"]);
    assert_eq!(group.size, 4);
    assert_eq!(group.bytes, 4);
    assert_eq!(group.max_items, 5);
    let opened = group.opened_at.unwrap();
    let due = group.due_at.unwrap();
    assert_eq!(due.seconds - opened.seconds, 600);
    assert_eq!(due.nanos, opened.nanos);
    service.stop().await;
}

/// A group keeps arrival order across removes, also past Redis's compact
/// hash encoding (whose fields come back in no order): items added after a
/// remove follow every item before it, in the group and in its batch.
#[tokio::test]
async fn arrival_order_holds_across_removes() {
    let (_redis, service, mut client) = setup().await;
    let add_ids = |from: usize, to: usize| pb::AddManyRequest {
        items: (from..to)
            .map(|i| add("long", &format!("i{i:03}"), b"p"))
            .collect(),
    };
    client.add_many(add_ids(0, 200)).await.unwrap();
    let removed: Vec<String> = (0..200).step_by(10).map(|i| format!("i{i:03}")).collect();
    for id in &removed {
        let r = remove(&mut client, "long", id).await;
        assert!(r.removed, "{id} was in the group");
    }
    client.add_many(add_ids(200, 400)).await.unwrap();
    let expected: Vec<String> = (0..400)
        .map(|i| format!("i{i:03}"))
        .filter(|id| !removed.contains(id))
        .collect();
    let ids = |items: &[pb::Item]| items.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    let group = client
        .get_group(pb::GetGroupRequest { key: "long".into() })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    assert_eq!(ids(&group.items), expected, "the open group's order");
    let flushed = client
        .flush(pb::FlushRequest { key: "long".into() })
        .await
        .unwrap()
        .into_inner();
    let batch = flushed.batch.expect("the flush writes the group");
    assert_eq!(ids(&batch.items), expected, "the batch's order");
    service.stop().await;
}

/// ListGroups pages through every group soonest-due first, filtered by prefix, without items.
#[tokio::test]
async fn list_groups_pages_in_due_order() {
    let redis = RedisServer::start();
    let extra = r#"
[defaults]
max_items = 100
max_wait = "10m"
[keys."late-*"]
max_wait = "20m"
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    let mut expected = Vec::new();
    for i in 0..25 {
        let key = if i % 2 == 0 {
            format!("late-{i}")
        } else {
            format!("soon-{i}")
        };
        client.add(add(&key, "a", b"")).await.unwrap();
        expected.push(key);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_groups(pb::ListGroupsRequest {
                page_size: 4,
                page_token: token.clone(),
                key_prefix: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.groups.len() <= 4);
        for group in &page.groups {
            assert!(group.items.is_empty());
            assert_eq!(group.size, 1);
            seen.push((group.due_at.unwrap(), group.key.clone()));
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut keys: Vec<&String> = seen.iter().map(|(_, k)| k).collect();
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected.iter().collect::<Vec<_>>(), "each group once");
    let dues: Vec<_> = seen.iter().map(|(d, _)| (d.seconds, d.nanos)).collect();
    let mut sorted = dues.clone();
    sorted.sort();
    assert_eq!(dues, sorted, "soonest due first");
    // Every "soon" group comes before every "late" one.
    let first_late = seen
        .iter()
        .position(|(_, k)| k.starts_with("late-"))
        .unwrap();
    assert!(
        seen[first_late..]
            .iter()
            .all(|(_, k)| k.starts_with("late-"))
    );
    let late = client
        .list_groups(pb::ListGroupsRequest {
            page_size: 100,
            page_token: String::new(),
            key_prefix: "late-".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.groups.len(), 13);
    assert!(late.next_page_token.is_empty());
    service.stop().await;
}

/// A bad add is INVALID_ARGUMENT naming the field in its message and error
/// details, and nothing is written for it; AddMany is all or nothing.
#[tokio::test]
async fn bad_adds_are_rejected_and_nothing_is_written() {
    let (redis, service, mut client) = setup().await;
    let long = "x".repeat(257);
    let no_item = pb::AddRequest {
        key: "k".into(),
        item: None,
        ..Default::default()
    };
    let cases: Vec<(pb::AddRequest, &str)> = vec![
        (add("", "a", b""), "key"),
        (add(&long, "a", b""), "key"),
        (add("k", "", b""), "item.id"),
        (add("k", &long, b""), "item.id"),
        (add("k", "a", &vec![0u8; 64 * 1024 + 1]), "item.payload"),
        (no_item, "item"),
    ];
    for (req, field) in cases {
        assert_invalid(&client.add(req).await.unwrap_err(), field);
    }
    let many = pb::AddManyRequest {
        items: vec![add("k", "ok", b""), add("k", "", b""), add("", "b", b"")],
    };
    let status = client.add_many(many).await.unwrap_err();
    assert_invalid(&status, "items[1].item.id");
    // Every bad item is named, one violation each (AIP-193 BadRequest).
    let bad = tonic_types::StatusExt::get_details_bad_request(&status).unwrap();
    let fields: Vec<_> = bad.field_violations.iter().map(|v| &v.field).collect();
    assert_eq!(fields, ["items[1].item.id", "items[2].key"]);
    assert_eq!(redis.data_keys(), "0", "nothing was written");
    service.stop().await;
}

/// Bad arguments to the other calls are INVALID_ARGUMENT naming the field,
/// and nothing is written for them.
#[tokio::test]
async fn bad_arguments_name_the_field() {
    let (redis, service, mut client) = setup().await;
    let remove = pb::RemoveRequest {
        key: "k".into(),
        item_id: String::new(),
    };
    assert_invalid(&client.remove(remove).await.unwrap_err(), "item_id");
    let flush = pb::FlushRequest { key: String::new() };
    assert_invalid(&client.flush(flush).await.unwrap_err(), "key");
    let list = pb::ListGroupsRequest {
        page_size: 0,
        page_token: "nonsense".into(),
        key_prefix: String::new(),
    };
    assert_invalid(&client.list_groups(list).await.unwrap_err(), "page_token");
    let list = pb::ListGroupsRequest {
        page_size: -1,
        ..Default::default()
    };
    assert_invalid(&client.list_groups(list).await.unwrap_err(), "page_size");
    let dead = pb::ListDeadLettersRequest {
        consumer_group: "g".into(),
        page_token: "nonsense".into(),
        ..Default::default()
    };
    assert_invalid(
        &client.list_dead_letters(dead).await.unwrap_err(),
        "page_token",
    );
    // A well-formed cursor that points past the streams is unknown too.
    let future = format!("c1{}", ".99999999999999-0".repeat(4));
    for after in ["bogus".to_string(), future] {
        let subscribe = pb::SubscribeRequest {
            after,
            ..Default::default()
        };
        assert_invalid(&client.subscribe(subscribe).await.unwrap_err(), "after");
    }
    assert_eq!(redis.data_keys(), "0", "nothing was written");
    service.stop().await;
}

/// The standard health service reports SERVING, and server reflection lists the
/// Batcher service, so grpcurl works without proto files.
#[tokio::test]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let (_redis, service, _client) = setup().await;
    let channel = support::channel(service.addr);
    support::wait_health(service.addr, ServingStatus::Serving).await;

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"batcher.v1.Batcher".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
    service.stop().await;
}
