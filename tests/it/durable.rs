//! Durable subscriptions against a real Redis: consumer groups, acks,
//! redelivery, dead letters, and retention that never drops an unacked batch.
//!
//! A test that is not about redelivery uses a long ack timeout, so that a slow
//! machine cannot redeliver a batch in the middle of it; a test about
//! redelivery accepts every redelivery the ack timeout allows.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::{
    RedisServer, Service, add, add_many, assert_invalid, config, eventually, next_batch,
    stream_len, wait_for_calls,
};
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use redis::streams::{StreamInfoGroupsReply, StreamPendingCountReply};
use tonic::transport::Channel;

/// One item per batch; subscriptions with this ack timeout and delivery limit.
fn durable(ack_timeout: &str, max_deliveries: u32) -> String {
    format!(
        "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n[subscriptions]\n\
         ack_timeout = \"{ack_timeout}\"\nmax_deliveries = {max_deliveries}\n"
    )
}

/// An ack timeout no test outlives: nothing is redelivered by timeout.
const PATIENT: &str = "1h";

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

/// Adds `n` items under `key` (one batch each); returns the batch ids.
async fn flush_n(client: &mut BatcherClient<Channel>, key: &str, n: usize) -> Vec<String> {
    let items = (0..n)
        .map(|i| add(key, &format!("{key}-{i}"), b""))
        .collect();
    add_many(client, items)
        .await
        .into_iter()
        .map(|r| r.flushed.expect("max_items = 1 flushes every add").id)
        .collect()
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

fn redis_conn(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .and_then(|client| client.get_connection())
        .expect("connect to redis")
}

fn stream(shard: u16) -> String {
    support::stream_key(shard)
}

/// The batches a consumer group holds unacked over the 4 test shards, by
/// batch id, with how often each was delivered. Panics if Redis cannot say.
fn pending(redis: &RedisServer, group: &str) -> HashMap<String, usize> {
    let mut conn = redis_conn(redis);
    let mut out = HashMap::new();
    for shard in 0..4 {
        let reply: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(stream(shard))
            .arg(group)
            .arg("-")
            .arg("+")
            .arg(100_000)
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("XPENDING {group} in shard {shard}: {e}"));
        for entry in reply.ids {
            out.insert(format!("{shard}-{}", entry.id), entry.times_delivered);
        }
    }
    out
}

/// Parses an entry id `ms-seq` for comparison.
fn entry(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').expect("an entry id");
    (ms.parse().unwrap(), seq.parse().unwrap())
}

/// Whether a consumer group has read (taken off the stream) the batch `id`.
fn has_read(redis: &RedisServer, group: &str, id: &str) -> bool {
    let (shard, id) = id.split_once('-').expect("a batch id");
    let reply: StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream(shard.parse().unwrap()))
        .query(&mut redis_conn(redis))
        .unwrap_or_else(|e| panic!("XINFO GROUPS in shard {shard}: {e}"));
    let info = reply.groups.iter().find(|g| g.name == group);
    let info = info.unwrap_or_else(|| panic!("no group {group} in shard {shard}"));
    entry(&info.last_delivered_id) >= entry(id)
}

/// Waits until the group has read every batch in `flushed` and holds exactly
/// `unacked` pending: whatever it read beyond that, it has acked.
async fn wait_settled(redis: &RedisServer, group: &str, flushed: &[String], unacked: &[String]) {
    let unacked: HashSet<&String> = unacked.iter().collect();
    eventually(
        "the group to read every batch and ack the ones it skips",
        || {
            let held = pending(redis, group);
            let settled = flushed.iter().all(|id| has_read(redis, group, id))
                && held.keys().collect::<HashSet<_>>() == unacked;
            async move { settled.then_some(()) }
        },
    )
    .await;
}

/// Receives from `stream` until every id in `ids` has arrived, accepting
/// redeliveries of those ids; returns each id's highest delivery count.
async fn receive_all(
    stream: &mut tonic::Streaming<pb::Batch>,
    ids: &HashSet<String>,
) -> HashMap<String, u32> {
    let mut seen = HashMap::new();
    while seen.len() < ids.len() {
        let batch = next_batch(stream).await;
        assert!(ids.contains(&batch.id), "unexpected batch {}", batch.id);
        let count = seen.entry(batch.id).or_insert(0);
        assert!(batch.delivery_count > *count, "delivery counts only grow");
        *count = batch.delivery_count;
    }
    seen
}

/// A consumer that reconnects gets back, first, exactly the batches it held
/// unacked, once more each and with the same ids; an acked batch never comes back.
#[tokio::test]
async fn a_reconnecting_consumer_gets_back_what_it_held() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &durable(PATIENT, 3))).await;
    let mut client = service.client().await;
    let mut first = subscribe(&mut client, "trucks", "c1").await;
    let ids = flush_n(&mut client, "k", 3).await;
    for id in &ids {
        let batch = next_batch(&mut first).await;
        assert_eq!((&batch.id, batch.delivery_count), (id, 1));
    }
    assert_eq!(ack(&mut client, "trucks", vec![ids[0].clone()]).await, 1);
    let again = ack(&mut client, "trucks", vec![ids[0].clone()]).await;
    assert_eq!(again, 0, "acking twice counts once");
    drop(first);

    let mut back = subscribe(&mut client, "trucks", "c1").await;
    for id in &ids[1..] {
        let batch = next_batch(&mut back).await;
        assert_eq!((&batch.id, batch.delivery_count), (id, 2));
    }
    let marker = flush_n(&mut client, "marker", 1).await;
    assert_eq!(
        next_batch(&mut back).await.id,
        marker[0],
        "nothing else came back"
    );
    service.stop().await;
}

/// Batches a gone consumer held unacked go, with the same ids, to another
/// consumer of the group, and not before they have been idle for ack_timeout.
#[tokio::test]
async fn idle_batches_go_to_another_consumer_after_ack_timeout() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &durable("400ms", 100))).await;
    let mut client = service.client().await;
    let mut gone = subscribe(&mut client, "trucks", "c1").await;
    let flushed_before = Instant::now();
    let ids: HashSet<String> = flush_n(&mut client, "k", 2).await.into_iter().collect();
    receive_all(&mut gone, &ids).await;
    drop(gone);

    let mut other = subscribe(&mut client, "trucks", "c2").await;
    let counts = receive_all(&mut other, &ids).await;
    assert!(
        flushed_before.elapsed() >= Duration::from_millis(400),
        "taken over before ack_timeout"
    );
    assert!(counts.values().all(|n| *n >= 2), "{counts:?}");
    assert_eq!(
        ack(&mut client, "trucks", ids.into_iter().collect()).await,
        2
    );
    service.stop().await;
}

/// Two consumer groups are independent and each gets every batch exactly
/// once; the consumers of one group share its batches: both get some, none twice.
#[tokio::test]
async fn groups_are_independent_and_consumers_share() {
    let redis = RedisServer::start();
    let extra = format!("{}buffer = 1\n", durable(PATIENT, 3));
    let service = Service::start(config(&redis.url(), &extra)).await;
    let mut client = service.client().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (group, consumer) in [("a", "1"), ("a", "2"), ("b", "1")] {
        let mut stream = subscribe(&mut client, group, consumer).await;
        let (tx, mut client) = (tx.clone(), client.clone());
        tokio::spawn(async move {
            while let Ok(Some(batch)) = stream.message().await {
                ack(&mut client, group, vec![batch.id.clone()]).await;
                if tx.send((group, consumer, batch.id)).is_err() {
                    return;
                }
            }
        });
    }
    // Which consumer of group a reads first is up to chance: flush rounds
    // until both have had some.
    let (mut flushed, mut got) = (HashSet::new(), HashMap::new());
    let started = Instant::now();
    while got.values().filter(|c| **c == ("a", "1")).count() == 0
        || got.values().filter(|c| **c == ("a", "2")).count() == 0
    {
        assert!(
            started.elapsed() < support::DEADLINE,
            "one consumer got nothing"
        );
        let round = flush_n(&mut client, &format!("k{}", flushed.len()), 10).await;
        flushed.extend(round);
        while got.len() < 2 * flushed.len() {
            let (group, consumer, id) = tokio::time::timeout(support::DEADLINE, rx.recv())
                .await
                .expect("a batch within the deadline")
                .expect("readers alive");
            let first = got.insert((group, id.clone()), (group, consumer));
            assert!(first.is_none(), "group {group} got {id} twice");
        }
    }
    for group in ["a", "b"] {
        let ids: HashSet<String> = got
            .keys()
            .filter(|k| k.0 == group)
            .map(|k| k.1.clone())
            .collect();
        assert_eq!(ids, flushed, "group {group} got every batch");
    }
    service.stop().await;
}

/// After max_deliveries a batch is dead-lettered and no longer delivered;
/// re-driving it delivers it again with the same id.
#[tokio::test]
async fn dead_letters_and_redrive() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &durable("400ms", 3))).await;
    let mut client = service.client().await;
    let mut stream = subscribe(&mut client, "g", "c").await;
    let poison = flush_n(&mut client, "poison", 1).await.remove(0);
    // One consumer, one batch, never acked: each ack_timeout hands it back once more.
    for expected in 1..=3 {
        let batch = next_batch(&mut stream).await;
        assert_eq!((&batch.id, batch.delivery_count), (&poison, expected));
    }
    let list = |client: &BatcherClient<Channel>| {
        let mut client = client.clone();
        async move {
            let request = pb::ListDeadLettersRequest {
                consumer_group: "g".into(),
                page_size: 0,
                ..Default::default()
            };
            let dead = client.list_dead_letters(request).await.unwrap();
            let ids: Vec<String> = dead
                .into_inner()
                .batches
                .into_iter()
                .map(|b| b.id)
                .collect();
            ids
        }
    };
    eventually("the batch to be dead-lettered", || async {
        (list(&client).await == [poison.clone()]).then_some(())
    })
    .await;
    // Not delivered a fourth time: the next thing this consumer sees is a new batch.
    let fresh = flush_n(&mut client, "fresh", 1).await.remove(0);
    assert_eq!(next_batch(&mut stream).await.id, fresh);
    ack(&mut client, "g", vec![fresh.clone()]).await;

    let request = pb::RedriveRequest {
        consumer_group: "g".into(),
        batch_ids: vec![poison.clone()],
    };
    assert_eq!(
        client.redrive(request).await.unwrap().into_inner().redriven,
        1
    );
    let again = loop {
        // `fresh` may legitimately come back if its ack came after ack_timeout.
        let batch = next_batch(&mut stream).await;
        if batch.id != fresh {
            break batch;
        }
    };
    assert_eq!(again.id, poison, "a re-driven batch keeps its id");
    assert_eq!(again.key, "poison");
    assert_eq!(ack(&mut client, "g", vec![again.id]).await, 1);
    assert!(list(&client).await.is_empty());
    service.stop().await;
}

/// A service SIGKILLed while its consumer holds pending batches loses
/// nothing: another instance redelivers them after ack_timeout.
#[tokio::test]
async fn pending_batches_survive_an_instance_crash() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let text = support::config_text(&redis.url(), &durable("400ms", 100));
    std::fs::write(&path, text).unwrap();
    let mut doomed = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(doomed.addr).await;
    let mut stream = subscribe(&mut client, "g", "on-doomed").await;
    let held: HashSet<String> = flush_n(&mut client, "k", 5).await.into_iter().collect();
    receive_all(&mut stream, &held).await;
    doomed.kill();

    let survivor = Service::start(config(&redis.url(), &durable("400ms", 100))).await;
    let mut client = survivor.client().await;
    let mut stream = subscribe(&mut client, "g", "on-survivor").await;
    let counts = receive_all(&mut stream, &held).await;
    assert!(counts.values().all(|n| *n >= 2), "{counts:?}");
    assert_eq!(ack(&mut client, "g", held.into_iter().collect()).await, 5);
    assert!(pending(&redis, "g").is_empty());
    survivor.stop().await;
}

/// Redis's clock, in ms since the epoch: the clock stream ids and trims use.
fn redis_ms(redis: &RedisServer) -> u64 {
    let time = redis.cli(&["TIME"]);
    let mut parts = time.lines().map(|p| p.trim().parse::<u64>().unwrap());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

/// When a batch was flushed, by Redis's clock (its entry id's ms part).
fn flushed_ms(batch_id: &str) -> u64 {
    entry(batch_id.split_once('-').unwrap().1).0
}

/// The ids of every batch retained in the streams.
async fn retained(redis: &RedisServer) -> HashSet<String> {
    let store = support::store(&config(&redis.url(), ""));
    support::all_batches(&store)
        .await
        .iter()
        .map(|b| b.id())
        .collect()
}

const RETENTION_MS: u64 = 2000;

/// Waits for two more trims per shard, then checks what is retained.
async fn assert_retained_after_trims(redis: &RedisServer, expected: &[String], why: &str) {
    wait_for_calls(redis, &["xtrim"], 2 * 4).await;
    let expected: HashSet<String> = expected.iter().cloned().collect();
    assert_eq!(retained(redis).await, expected, "{why}");
}

/// Retention trims acked batches once they are older than the retention and
/// never sooner, and never trims a batch a consumer group holds unacked or
/// has not read yet, however old.
#[tokio::test]
async fn retention_trims_old_acked_batches_and_keeps_unread_ones() {
    let redis = RedisServer::start();
    let extra = format!(
        "{}retention = \"{RETENTION_MS}ms\"\ntrim_every = \"20ms\"\n[sweeper]\nmax_sleep = \"20ms\"\n",
        durable(PATIENT, 3)
    );
    let service = Service::start(config(&redis.url(), &extra)).await;
    let mut client = service.client().await;
    let mut slow = subscribe(&mut client, "slow", "c").await;
    let old = flush_n(&mut client, "k", 3).await;
    receive_all(&mut slow, &old.iter().cloned().collect()).await;
    assert_eq!(ack(&mut client, "slow", old.clone()).await, 3);
    // Acked but younger than the retention: kept, however often the trim runs.
    assert_retained_after_trims(&redis, &old, "young batches are kept").await;
    let age = redis_ms(&redis) - flushed_ms(&old[0]);
    assert!(age < RETENTION_MS, "too slow to look within the retention");
    eventually("old acked batches to be trimmed", || {
        let gone = stream_len(&redis) == 0;
        async move { gone.then_some(()) }
    })
    .await;

    // Group "never" is created now and reads nothing.
    for shard in 0..4 {
        let created = redis.cli(&["XGROUP", "CREATE", &stream(shard), "never", "$", "MKSTREAM"]);
        assert_eq!(created, "OK");
    }
    let new = flush_n(&mut client, "k2", 4).await;
    receive_all(&mut slow, &new.iter().cloned().collect()).await;
    assert_eq!(ack(&mut client, "slow", new[..2].to_vec()).await, 2);
    let newest = flushed_ms(&new[3]);
    eventually("the batches to be older than the retention", || {
        let old_enough = redis_ms(&redis) > newest + RETENTION_MS;
        async move { old_enough.then_some(()) }
    })
    .await;
    assert_retained_after_trims(&redis, &new, "unread by group never").await;
    for shard in 0..4 {
        assert_eq!(
            redis.cli(&["XGROUP", "DESTROY", &stream(shard), "never"]),
            "1"
        );
    }
    eventually("the batches only \"never\" kept to be trimmed", || {
        let two_left = stream_len(&redis) == 2;
        async move { two_left.then_some(()) }
    })
    .await;
    assert_retained_after_trims(&redis, &new[2..], "unacked by group slow").await;
    assert_eq!(ack(&mut client, "slow", new[2..].to_vec()).await, 2);
    eventually("the rest to be trimmed", || {
        let gone = stream_len(&redis) == 0;
        async move { gone.then_some(()) }
    })
    .await;
    service.stop().await;
}

/// Bytes of payload per batch in the stalled-consumer test: a large share of
/// the stalled connection's HTTP/2 window.
const STALL_PAYLOAD: usize = 60 * 1024;

/// A stalled durable consumer blocks neither flushes nor other subscribers,
/// and holds (has taken off the stream, unacked) only what its queue and the
/// transport between it and the client hold, not every batch.
#[tokio::test]
async fn stalled_consumer_blocks_nothing() {
    let redis = RedisServer::start();
    // The stalled client never hangs up, so shutdown waits out the grace period.
    let buffer = 2;
    let extra = format!(
        "shutdown_grace = \"500ms\"\n{}buffer = {buffer}\n",
        durable(PATIENT, 3)
    );
    let service = Service::start(config(&redis.url(), &extra)).await;
    // Each subscriber on its own connection, as separate processes would be:
    // an unread stream fills its connection's HTTP/2 window. The stalled one's
    // window is HTTP/2's default 64 KiB, whatever the client library prefers.
    let window = 65_535;
    let stalled_channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", service.addr))
            .unwrap()
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .connect()
            .await
            .unwrap();
    let _stalled = subscribe(&mut BatcherClient::new(stalled_channel), "stalled", "c").await;
    let mut live = service
        .client()
        .await
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut other = subscribe(&mut service.client().await, "other", "c").await;
    let mut client = service.client().await;
    let payload = vec![7u8; STALL_PAYLOAD];
    for i in 0..300 {
        client
            .add(add("k", &i.to_string(), &payload))
            .await
            .unwrap();
        next_batch(&mut live).await;
        let batch = next_batch(&mut other).await;
        ack(&mut client, "other", vec![batch.id]).await;
    }
    // It holds its queue (`buffer`), one read of at most `buffer` being
    // delivered, what the window takes, and a message in each of the gRPC
    // encoder and the HTTP/2 sender waiting for window.
    let bound = 2 * buffer + window.div_ceil(STALL_PAYLOAD as u32) as usize + 2;
    let held = pending(&redis, "stalled").len();
    assert!(
        held <= bound,
        "a stalled consumer took {held} batches, more than {bound}"
    );
    service.stop().await;
}

/// A group's key filters are part of its definition: unmatched batches are
/// acked for it without delivery, and a consumer joining with no filters
/// takes the group's; other filters, bad names and bad batch ids are
/// INVALID_ARGUMENT naming the field.
#[tokio::test]
async fn group_filters_and_validation() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &durable("1s", 100))).await;
    let mut client = service.client().await;
    let request = pb::SubscribeRequest {
        key_prefixes: vec!["north-".into()],
        consumer_group: "north".into(),
        consumer: "c".into(),
        ..Default::default()
    };
    let mut first = client.subscribe(request).await.unwrap().into_inner();
    let mut flushed = Vec::new();
    for key in ["south-1", "north-1", "east", "north-2"] {
        flushed.extend(flush_n(&mut client, key, 1).await);
    }
    let north = vec![flushed[1].clone(), flushed[3].clone()];
    receive_all(&mut first, &north.iter().cloned().collect()).await;
    wait_settled(&redis, "north", &flushed, &north).await;

    // Joining with no filters takes the group's: d gets north-3, never west.
    let mut joined = subscribe(&mut client, "north", "d").await;
    drop(first);
    for key in ["west", "north-3"] {
        flushed.extend(flush_n(&mut client, key, 1).await);
    }
    let north_3 = flushed[5].clone();
    loop {
        // d may first take over north-1 and north-2, idle for ack_timeout.
        let batch = next_batch(&mut joined).await;
        assert!(batch.key.starts_with("north-"), "d got {}", batch.key);
        if batch.id == north_3 {
            break;
        }
    }
    let north = [north, vec![north_3]].concat();
    wait_settled(&redis, "north", &flushed, &north).await;

    let request = pb::SubscribeRequest {
        keys: vec!["other".into()],
        consumer_group: "north".into(),
        consumer: "e".into(),
        ..Default::default()
    };
    assert_invalid(&client.subscribe(request).await.unwrap_err(), "keys");
    for (group, consumer, field) in [("bad name", "c", "consumer_group"), ("g", "", "consumer")] {
        let request = pb::SubscribeRequest {
            consumer_group: group.into(),
            consumer: consumer.into(),
            ..Default::default()
        };
        assert_invalid(&client.subscribe(request).await.unwrap_err(), field);
    }
    let request = pb::AckRequest {
        consumer_group: "north".into(),
        batch_ids: vec!["nonsense".into()],
    };
    assert_invalid(&client.ack(request).await.unwrap_err(), "batch_ids[0]");
    let unknown = ack(&mut client, "north", vec!["0-1-0".into()]).await;
    assert_eq!(unknown, 0, "an unknown id is not an error");
    service.stop().await;
}
