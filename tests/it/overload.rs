//! Overload against a real Redis: a full shard queue, Redis at `maxmemory`,
//! and the subscriber and message size limits, each refused with
//! RESOURCE_EXHAUSTED and nothing half written.

use std::time::{Duration, Instant};

use crate::support::{
    Paused, RedisServer, Service, add, all_batches, assert_error_info, config, eventually,
    next_batch, store,
};
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Two keys on different shards of the tests' 4-shard keyspace.
fn keys_on_two_shards() -> (String, String) {
    let keyspace = Keyspace::new("batcher", 4);
    let first = "full".to_owned();
    let other = (0..)
        .map(|i| format!("other-{i}"))
        .find(|k| keyspace.shard_of(k) != keyspace.shard_of(&first))
        .unwrap();
    (first, other)
}

/// An add with a client deadline of `timeout`.
fn add_within(key: &str, id: &str, timeout: Duration) -> Request<pb::AddRequest> {
    let mut request = Request::new(add(key, id, b"x"));
    request.set_timeout(timeout);
    request
}

/// The ids in the open group of `key`.
async fn group_ids(client: &mut BatcherClient<Channel>, key: &str) -> Vec<String> {
    let reply = client.get_group(pb::GetGroupRequest { key: key.into() });
    let group = reply.await.expect("get_group").into_inner().group;
    let items = group.map(|g| g.items).unwrap_or_default();
    items.iter().map(|item| item.id.clone()).collect()
}

/// With its shard's queue full (Redis hung), an add fails at once with
/// RESOURCE_EXHAUSTED naming the shard, and an AddMany spanning that shard
/// and another writes nothing on either.
#[tokio::test]
async fn full_shard_queue_refuses_at_once() {
    let redis = RedisServer::start();
    let mut config = config(&redis.url(), "[limits]\nmax_queued_adds = 4\n");
    config.redis.response_timeout = Duration::from_secs(10);
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let (full, other) = keys_on_two_shards();
    client.add(add(&full, "warm-up", b"")).await.unwrap();

    let paused = Paused::new(&redis);
    // Each probe either queues (and fails at its short deadline, still
    // holding its room until the writer drops it) or finds the queue full.
    let mut refused = None;
    for i in 0..10 {
        let started = Instant::now();
        let reply = client
            .add(add_within(
                &full,
                &format!("p{i}"),
                Duration::from_millis(200),
            ))
            .await;
        let status = reply.expect_err("redis is stopped");
        if status.code() == Code::ResourceExhausted {
            refused = Some((status, started.elapsed()));
            break;
        }
        match status.code() {
            Code::Unavailable => _ = assert_error_info(&status, "REDIS_TIMEOUT"),
            // The client's own timer for the same 200 ms, which on a busy
            // machine can fire before the service's answer arrives.
            Code::Cancelled => assert_eq!(status.message(), "Timeout expired", "{status:?}"),
            _ => panic!("a probe failed otherwise: {status:?}"),
        }
    }
    let (status, took) = refused.expect("the queue never filled");
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    let meta = assert_error_info(&status, "SHARD_QUEUE_FULL");
    let shard = Keyspace::new("batcher", 4).shard_of(&full);
    assert_eq!(meta["shard"], shard.to_string(), "{meta:?}");
    assert_eq!(meta["limit"], "4");

    let many = pb::AddManyRequest {
        items: vec![add(&other, "x", b""), add(&full, "y", b"")],
    };
    let status = client.add_many(many).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_error_info(&status, "SHARD_QUEUE_FULL");
    drop(paused);

    eventually("adds to work again", || {
        let mut client = client.clone();
        let full = full.clone();
        async move { client.add(add(&full, "after", b"")).await.ok() }
    })
    .await;
    assert!(group_ids(&mut client, &other).await.is_empty());
    let ids = group_ids(&mut client, &full).await;
    assert!(ids.contains(&"after".to_owned()), "{ids:?}");
    assert!(!ids.contains(&"y".to_owned()), "{ids:?}");
    service.stop().await;
}

/// The number of OOM errors Redis has answered so far.
fn oom_errors(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "errorstats"]);
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix("errorstat_OOM:count="))
        .map_or(0, |n| n.parse().expect("an error count"))
}

/// With Redis at maxmemory, adds fail RESOURCE_EXHAUSTED ("redis is out of
/// memory (maxmemory)") writing nothing, reads and subscriptions work, the
/// sweeper keeps a group that fell due; with memory freed, adds work again
/// and the group is flushed whole.
#[tokio::test]
async fn redis_at_maxmemory_refuses_writes_and_recovers() {
    let redis = RedisServer::start();
    // 3 s: long enough for maxmemory to be set before "open" falls due.
    let extra = "[defaults]\nmax_items = 3\nmax_wait = \"3s\"\n[sweeper]\nmax_sleep = \"100ms\"\n";
    let config = config(&redis.url(), extra);
    let service = Service::start(config.clone()).await;
    let mut client = service.client().await;
    for id in ["d1", "d2", "d3"] {
        client.add(add("done", id, b"payload")).await.unwrap();
    }
    client.add(add("open", "o1", b"payload")).await.unwrap();

    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let status = client.add(add("k", "1", b"")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "redis is out of memory (maxmemory)");
    let meta = assert_error_info(&status, "REDIS_OUT_OF_MEMORY");
    assert_eq!(meta["redis_code"], "OOM");
    let (a, b) = keys_on_two_shards();
    let many = pb::AddManyRequest {
        items: vec![
            add(&a, "m1", b""),
            add(&b, "m2", b""),
            add("open", "m3", b""),
        ],
    };
    let status = client.add_many(many).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // Reads work: the open group, the list, a subscription from the start.
    assert_eq!(group_ids(&mut client, "open").await, ["o1"]);
    let list = client.list_groups(pb::ListGroupsRequest::default());
    assert_eq!(list.await.unwrap().into_inner().groups.len(), 1);
    let from_start = pb::SubscribeRequest {
        after: "0".into(),
        ..Default::default()
    };
    let mut stream = client.subscribe(from_start).await.unwrap().into_inner();
    assert_eq!(next_batch(&mut stream).await.key, "done");

    // The group falls due; the sweeper's flushes are refused, and it keeps it.
    let refused = oom_errors(&redis);
    eventually("the sweeper to try flushing at OOM", || {
        let tried = oom_errors(&redis) >= refused + 5;
        async move { tried.then_some(()) }
    })
    .await;
    assert_eq!(group_ids(&mut client, "open").await, ["o1"]);

    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    client.add(add("k", "2", b"")).await.unwrap();
    let batch = eventually("the due group to flush", || {
        let store = store(&config);
        async move {
            let batches = all_batches(&store).await;
            batches.into_iter().find(|batch| batch.key == "open")
        }
    })
    .await;
    let ids: Vec<&[u8]> = batch.items.iter().map(|i| i.id.as_slice()).collect();
    assert_eq!(ids, [b"o1"]);
    assert_eq!(group_ids(&mut client, "k").await, ["2"]);
    assert!(group_ids(&mut client, &a).await.is_empty());
    assert!(group_ids(&mut client, &b).await.is_empty());
    service.stop().await;
}

/// A live subscription and a durable one take the two slots of
/// max_subscribers = 2; the third is refused RESOURCE_EXHAUSTED, and a slot
/// frees when a stream is dropped.
#[tokio::test]
async fn max_subscribers_refuses_the_next_until_one_ends() {
    let redis = RedisServer::start();
    let config = config(&redis.url(), "[limits]\nmax_subscribers = 2\n");
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let live = client.subscribe(pb::SubscribeRequest::default()).await;
    let live = live.unwrap().into_inner();
    let durable = pb::SubscribeRequest {
        consumer_group: "g".into(),
        consumer: "c".into(),
        ..Default::default()
    };
    let _durable = client.subscribe(durable).await.unwrap().into_inner();

    let status = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .expect_err("a third subscription is refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let meta = assert_error_info(&status, "TOO_MANY_SUBSCRIBERS");
    assert_eq!(meta["limit"], "2");

    drop(live);
    eventually("a slot to free", || {
        let mut client = client.clone();
        async move {
            let reply = client.subscribe(pb::SubscribeRequest::default()).await;
            reply.ok().map(|stream| stream.into_inner())
        }
    })
    .await;
    service.stop().await;
}

/// A request over max_message_bytes fails RESOURCE_EXHAUSTED with an
/// ErrorInfo, and writes nothing; a smaller one goes through.
#[tokio::test]
async fn message_over_the_size_limit_is_refused() {
    let redis = RedisServer::start();
    let config = config(
        &redis.url(),
        "[limits]\nmax_message_bytes = 1024\nmax_payload_bytes = 512\nmax_key_bytes = 64\nmax_item_id_bytes = 64\n",
    );
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let status = client
        .add(add("k", "big", &[b'x'; 2000]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert_error_info(&status, "MESSAGE_TOO_LARGE");
    client.add(add("k", "small", &[b'x'; 500])).await.unwrap();
    assert_eq!(group_ids(&mut client, "k").await, ["small"]);
    service.stop().await;
}
