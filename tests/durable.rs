//! Durable subscriptions against a real Redis: consumer groups, acks,
//! redelivery, dead letters, and retention that never drops an unacked batch.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use support::{Process, RedisServer, Service, add, config, eventually, next_batch};
use tonic::transport::Channel;

const DURABLE: &str = r#"
[defaults]
max_items = 1
max_wait = "10m"
[subscriptions]
ack_timeout = "400ms"
max_deliveries = 3
"#;

async fn subscribe(
    client: &mut BatcherClient<Channel>,
    group: &str,
    consumer: &str,
) -> tonic::Streaming<pb::Batch> {
    client
        .subscribe(pb::SubscribeRequest {
            consumer_group: group.into(),
            consumer: consumer.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn flush_n(client: &mut BatcherClient<Channel>, key: &str, n: usize) {
    let items = (0..n)
        .map(|i| add(key, &format!("{key}-{i}"), b""))
        .collect();
    client.add_many(pb::AddManyRequest { items }).await.unwrap();
}

/// How many batches a consumer group holds unacked, over the 4 test shards.
fn pending(redis: &RedisServer, group: &str) -> usize {
    (0..4)
        .map(|shard| {
            let out = redis.cli(&["XPENDING", &format!("{{batcher:{shard}}}:batches"), group]);
            out.lines()
                .next()
                .unwrap_or("0")
                .trim()
                .parse::<usize>()
                .unwrap_or(0)
        })
        .sum()
}

async fn ack(client: &mut BatcherClient<Channel>, group: &str, ids: Vec<String>) -> u32 {
    client
        .ack(pb::AckRequest {
            consumer_group: group.into(),
            batch_ids: ids,
        })
        .await
        .unwrap()
        .into_inner()
        .acked
}

/// Batches a consumer held unacked when it disconnected come back to it on
/// reconnect, and (after ack_timeout) to another consumer of the group; an
/// acked batch never comes back.
#[tokio::test]
async fn unacked_batches_are_redelivered() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), DURABLE)).await;
    let mut client = service.client().await;
    let mut first = subscribe(&mut client, "trucks", "c1").await;
    flush_n(&mut client, "k", 3).await;
    let got: Vec<pb::Batch> = vec![
        next_batch(&mut first).await,
        next_batch(&mut first).await,
        next_batch(&mut first).await,
    ];
    assert!(got.iter().all(|b| b.delivery_count == 1));
    assert_eq!(ack(&mut client, "trucks", vec![got[0].id.clone()]).await, 1);
    assert_eq!(
        ack(&mut client, "trucks", vec![got[0].id.clone()]).await,
        0,
        "acking twice counts once"
    );
    drop(first);

    let mut again = subscribe(&mut client, "trucks", "c1").await;
    let mut redelivered = HashMap::new();
    for _ in 0..2 {
        let batch = next_batch(&mut again).await;
        redelivered.insert(batch.id.clone(), batch.delivery_count);
    }
    let expected: HashMap<String, u32> = got[1..].iter().map(|b| (b.id.clone(), 2)).collect();
    assert_eq!(
        redelivered, expected,
        "the same ids, delivered a second time"
    );
    drop(again);

    // Another consumer takes them over once they have been idle for ack_timeout.
    let mut other = subscribe(&mut client, "trucks", "c2").await;
    let batch = next_batch(&mut other).await;
    assert!(expected.contains_key(&batch.id));
    assert_eq!(batch.delivery_count, 3);
    let second = next_batch(&mut other).await;
    assert_eq!(
        ack(&mut client, "trucks", vec![batch.id, second.id]).await,
        2
    );
    service.stop().await;
}

/// Two consumer groups are independent and each gets every batch; consumers
/// of one group share its batches, each batch going to one of them.
#[tokio::test]
async fn groups_are_independent_and_consumers_share() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), DURABLE)).await;
    let mut client = service.client().await;
    let a1 = subscribe(&mut client, "a", "1").await;
    let a2 = subscribe(&mut client, "a", "2").await;
    let mut b = subscribe(&mut client, "b", "1").await;
    flush_n(&mut client, "k", 40).await;
    let mut b_ids = HashSet::new();
    for _ in 0..40 {
        let batch = next_batch(&mut b).await;
        assert!(b_ids.insert(batch.id.clone()));
        ack(&mut client, "b", vec![batch.id]).await;
    }
    // Group a's two consumers split the batches between them.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for mut stream in [a1, a2] {
        let tx = tx.clone();
        let mut client = client.clone();
        tokio::spawn(async move {
            while let Ok(Some(batch)) = stream.message().await {
                ack(&mut client, "a", vec![batch.id.clone()]).await;
                if tx.send(batch.id).is_err() {
                    return;
                }
            }
        });
    }
    let mut a_ids = HashSet::new();
    while a_ids.len() < 40 {
        let id = tokio::time::timeout(support::DEADLINE, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            a_ids.insert(id),
            "a batch went to two consumers of one group"
        );
    }
    assert_eq!(a_ids, b_ids);
    service.stop().await;
}

/// After max_deliveries a batch is dead-lettered and no longer delivered;
/// re-driving it delivers it again with the same id.
#[tokio::test]
async fn dead_letters_and_redrive() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), DURABLE)).await;
    let mut client = service.client().await;
    let mut stream = subscribe(&mut client, "g", "c").await;
    flush_n(&mut client, "poison", 1).await;
    let mut poison_id = String::new();
    for expected in 1..=3 {
        let batch = next_batch(&mut stream).await;
        assert_eq!(batch.delivery_count, expected);
        poison_id = batch.id;
    }
    // Not delivered a fourth time: the next thing this consumer sees is a new batch.
    let dead = eventually("the batch to be dead-lettered", || {
        let mut client = client.clone();
        async move {
            let dead = client
                .list_dead_letters(pb::ListDeadLettersRequest {
                    consumer_group: "g".into(),
                    limit: 0,
                })
                .await
                .unwrap()
                .into_inner()
                .batches;
            (!dead.is_empty()).then_some(dead)
        }
    })
    .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, poison_id);
    flush_n(&mut client, "fresh", 1).await;
    let fresh = next_batch(&mut stream).await;
    assert_eq!(fresh.key, "fresh");
    ack(&mut client, "g", vec![fresh.id]).await;

    let redriven = client
        .redrive(pb::RedriveRequest {
            consumer_group: "g".into(),
            batch_ids: vec![poison_id.clone()],
        })
        .await
        .unwrap()
        .into_inner()
        .redriven;
    assert_eq!(redriven, 1);
    let again = next_batch(&mut stream).await;
    assert_eq!(again.id, poison_id, "a re-driven batch keeps its id");
    assert_eq!(again.key, "poison");
    assert_eq!(ack(&mut client, "g", vec![again.id]).await, 1);
    let dead = client
        .list_dead_letters(pb::ListDeadLettersRequest {
            consumer_group: "g".into(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .batches;
    assert!(dead.is_empty());
    service.stop().await;
}

/// A service SIGKILLed while its consumer holds pending batches loses
/// nothing: another instance redelivers them after ack_timeout.
#[tokio::test]
async fn pending_batches_survive_an_instance_crash() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(
        &path,
        format!("[redis]\nurl = \"{}\"\nshards = 4\n{DURABLE}", redis.url()),
    )
    .unwrap();
    let mut doomed = Process::start(&path, dir.path()).await;
    let mut client = support::client(doomed.addr).await;
    let mut stream = subscribe(&mut client, "g", "on-doomed").await;
    flush_n(&mut client, "k", 5).await;
    let mut held = HashSet::new();
    for _ in 0..5 {
        held.insert(next_batch(&mut stream).await.id);
    }
    doomed.kill();

    let survivor = Service::start(config(&redis.url(), DURABLE)).await;
    let mut client = survivor.client().await;
    let mut stream = subscribe(&mut client, "g", "on-survivor").await;
    let mut redelivered = HashSet::new();
    for _ in 0..5 {
        let batch = next_batch(&mut stream).await;
        assert_eq!(batch.delivery_count, 2);
        redelivered.insert(batch.id.clone());
        ack(&mut client, "g", vec![batch.id]).await;
    }
    assert_eq!(redelivered, held);
    survivor.stop().await;
}

/// Retention never trims a batch some group has not acked, and does trim
/// batches every group has acked once they are older than the retention.
#[tokio::test]
async fn retention_keeps_unacked_batches_and_trims_the_rest() {
    let redis = RedisServer::start();
    let extra = r#"
[defaults]
max_items = 1
max_wait = "10m"
[subscriptions]
ack_timeout = "1h"
retention = "1ms"
trim_every = "50ms"
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    let mut stream = subscribe(&mut client, "slow", "c").await;
    flush_n(&mut client, "k", 6).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(next_batch(&mut stream).await.id);
    }
    assert_eq!(ack(&mut client, "slow", ids[..3].to_vec()).await, 3);
    let stream_len = |redis: &RedisServer| -> usize {
        (0..4)
            .map(|shard| {
                redis
                    .cli(&["XLEN", &format!("{{batcher:{shard}}}:batches")])
                    .parse::<usize>()
                    .unwrap()
            })
            .sum()
    };
    // The acked half goes; the unacked half stays however often the trim runs.
    eventually("acked batches to be trimmed", || {
        let len = stream_len(&redis);
        async move { (len == 3).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stream_len(&redis), 3, "unacked batches are never trimmed");
    // A group that has not read a batch yet protects it too.
    drop(stream);
    assert_eq!(ack(&mut client, "slow", ids[3..].to_vec()).await, 3);
    eventually("the rest to be trimmed", || {
        let len = stream_len(&redis);
        async move { (len == 0).then_some(()) }
    })
    .await;
    service.stop().await;
}

/// A stalled durable consumer blocks neither flushes nor other subscribers,
/// and takes only what its queue and the HTTP/2 window hold, not every batch.
#[tokio::test]
async fn stalled_consumer_blocks_nothing() {
    let redis = RedisServer::start();
    // The stalled client never hangs up, so shutdown waits out the grace period.
    let extra = format!("shutdown_grace = \"500ms\"\n{DURABLE}\nbuffer = 2\n");
    let service = Service::start(config(&redis.url(), &extra)).await;
    // Each subscriber on its own connection, as separate processes would be:
    // an unread stream fills its connection's HTTP/2 window.
    let _stalled = subscribe(&mut service.client().await, "stalled", "c").await;
    let mut live = service
        .client()
        .await
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut other = subscribe(&mut service.client().await, "other", "c").await;
    let mut client = service.client().await;
    // Large payloads, so the transport's buffers hold only a few batches.
    let payload = vec![7u8; 60 * 1024];
    for i in 0..300 {
        client
            .add(add("k", &i.to_string(), &payload))
            .await
            .unwrap();
        next_batch(&mut live).await;
        let batch = next_batch(&mut other).await;
        ack(&mut client, "other", vec![batch.id]).await;
    }
    let held = pending(&redis, "stalled");
    assert!(held < 150, "a stalled consumer took {held} of 300 batches");
    service.stop().await;
}

/// A group's key filters are part of its definition: unmatched batches are
/// acked for it without delivery, and a consumer asking for other filters is
/// refused; bad names and batch ids are INVALID_ARGUMENT naming the field.
#[tokio::test]
async fn group_filters_and_validation() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), DURABLE)).await;
    let mut client = service.client().await;
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            key_prefixes: vec!["north-".into()],
            consumer_group: "north".into(),
            consumer: "c".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for key in ["south-1", "north-1", "east", "north-2"] {
        flush_n(&mut client, key, 1).await;
    }
    assert_eq!(next_batch(&mut stream).await.key, "north-1");
    assert_eq!(next_batch(&mut stream).await.key, "north-2");
    assert_eq!(
        pending(&redis, "north"),
        2,
        "unmatched batches were acked for the group"
    );
    // Joining with no filters takes the group's; other filters are refused.
    let mut joined = client
        .subscribe(pb::SubscribeRequest {
            consumer_group: "north".into(),
            consumer: "d".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    drop(stream);
    flush_n(&mut client, "west", 1).await;
    flush_n(&mut client, "north-3", 1).await;
    let batch = next_batch(&mut joined).await;
    assert!(batch.key.starts_with("north-"), "{}", batch.key);
    let status = client
        .subscribe(pb::SubscribeRequest {
            keys: vec!["other".into()],
            consumer_group: "north".into(),
            consumer: "e".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("keys:"),
        "{}",
        status.message()
    );
    for (group, consumer, field) in [("bad name", "c", "consumer_group"), ("g", "", "consumer")] {
        let status = client
            .subscribe(pb::SubscribeRequest {
                consumer_group: group.into(),
                consumer: consumer.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{}",
            status.message()
        );
    }
    let status = client
        .ack(pb::AckRequest {
            consumer_group: "north".into(),
            batch_ids: vec!["nonsense".into()],
        })
        .await
        .unwrap_err();
    assert!(
        status.message().starts_with("batch_ids[0]:"),
        "{}",
        status.message()
    );
    let unknown = ack(&mut client, "north", vec!["0-1-0".into()]).await;
    assert_eq!(unknown, 0, "an unknown id is not an error");
    service.stop().await;
}
