//! The data format marker: a service refuses, with one line that says what
//! it found and what to do, to start on a prefix that holds data in another
//! format, older (unmarked shard keys) or unknown; on an empty prefix it
//! marks the format it writes. Started while Redis is down, it checks
//! before its first add or consumer group, and writes nothing in another
//! format.

use crate::support;

use crate::support::redis::RedisServer;
use crate::support::{Service, add, start_error};
use batcher::keys::Keyspace;
use batcher::scripts::FORMAT;
use tonic::Code;

/// An empty prefix gets the marker; a prefix holding format 1 (shard keys,
/// no marker), the format before this build's, or a newer one refuses the
/// start and is left as it was.
#[tokio::test]
async fn a_prefix_in_another_format_refuses_to_start() {
    let redis = RedisServer::start();
    let marker = Keyspace::new("batcher", 4).format_marker();
    add_once(&redis, "1", "an add on a fresh prefix").await;
    assert_eq!(redis.cli(&["GET", &marker]), FORMAT.to_string());

    for other in [FORMAT - 1, FORMAT + 1].map(|f| f.to_string()) {
        redis.cli(&["SET", &marker, &other]);
        let msg = start_error(support::config(&redis.url(), "")).await;
        assert!(
            msg.contains(&format!("format {other} ")) && msg.contains(&format!("format {FORMAT};")),
            "{msg}"
        );
        assert!(msg.contains("prefix \"batcher\""), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert_eq!(
            redis.cli(&["GET", &marker]),
            other,
            "the marker was overwritten"
        );
    }

    redis.cli(&["DEL", &marker]);
    let due = Keyspace::new("batcher", 4).shard(2).due;
    redis.cli(&["ZADD", &due, "1", "old-group"]);
    let msg = start_error(support::config(&redis.url(), "")).await;
    assert!(msg.contains("format 1"), "{msg}");
    assert_eq!(
        redis.cli(&["EXISTS", &marker]),
        "0",
        "format 1 was marked {FORMAT}"
    );
}

/// A service started while Redis is down finds the other format when Redis
/// comes back: its adds fail FAILED_PRECONDITION naming the format found,
/// and write nothing.
#[tokio::test]
async fn a_service_started_before_redis_checks_before_its_first_add() {
    let mut redis = RedisServer::start();
    let marker = Keyspace::new("batcher", 4).format_marker();
    let newer = (FORMAT + 1).to_string();
    redis.cli(&["SET", &marker, &newer]);
    redis.stop();
    let service = Service::start(support::config(&redis.url(), "")).await;
    let client = service.client().await;
    // Serving (past its start) while Redis is down: an add is UNAVAILABLE.
    let add_now = |id: &'static str| {
        let mut client = client.clone();
        async move { client.add(add("k", id, b"p")).await }
    };
    support::eventually("the service to serve without Redis", || async {
        let code = add_now("1").await.err()?.code();
        (code == Code::Unavailable).then_some(())
    })
    .await;
    redis.restart();
    let status = support::eventually("an add to meet the restarted Redis", || async {
        match add_now("1").await {
            Err(status) if status.code() == Code::Unavailable => None,
            done => Some(done),
        }
    })
    .await
    .expect_err("an add into a newer format");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains(&format!("format {newer} ")),
        "{}",
        status.message()
    );
    assert_eq!(redis.data_keys(), "0", "an add wrote into a newer format");
    assert_eq!(redis.cli(&["GET", &marker]), newer);
    service.stop().await;
}

/// A store whose first write is a consumer group (which makes the empty
/// shard streams) still finds the prefix empty, not format 1, at its first
/// add: the add lands and the marker is its own.
#[tokio::test]
async fn a_consumer_group_made_before_the_first_add_is_not_format_1() {
    let redis = RedisServer::start();
    let store = support::store(&support::config(&redis.url(), ""));
    store
        .create_consumer_group("trucks", "", false)
        .await
        .expect("the consumer group");
    let item = batcher::store::NewItem {
        key: "k".into(),
        item: batcher::batch::Item::new("1", "p"),
        policy: batcher::policy::Policy::default(),
        close: false,
        requeue_of: None,
    };
    store.add(vec![item]).await.expect("the first add");
    let marker = Keyspace::new("batcher", 4).format_marker();
    assert_eq!(redis.cli(&["GET", &marker]), FORMAT.to_string());
}

/// A prefix recorded with another shard count refuses the start with one
/// line naming both counts and the fix, and is left as it was; a prefix
/// marked before counts were recorded takes the configured count, and a
/// fresh prefix records it with the format.
#[tokio::test]
async fn a_prefix_of_another_shard_count_refuses_to_start() {
    let redis = RedisServer::start();
    let keys = Keyspace::new("batcher", 4);
    let (marker, shards) = (keys.format_marker(), keys.shards_marker());
    add_once(&redis, "1", "an add on a fresh prefix").await;
    assert_eq!(redis.cli(&["GET", &shards]), "4");

    let mut eight = support::config(&redis.url(), "");
    eight.redis.shards = std::num::NonZeroU16::new(8).expect("8 is not 0");
    let msg = start_error(eight).await;
    assert!(
        msg.contains("in 4 shards under prefix \"batcher\"")
            && msg.contains("[redis] shards = 8;")
            && msg.contains("set shards = 4"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "one line: {msg}");
    assert_eq!(
        redis.cli(&["GET", &shards]),
        "4",
        "the count was overwritten"
    );
    assert_eq!(
        redis.cli(&["GET", &marker]),
        FORMAT.to_string(),
        "the marker was changed"
    );

    redis.cli(&["DEL", &shards]);
    add_once(
        &redis,
        "2",
        "an add on a prefix marked before counts were recorded",
    )
    .await;
    assert_eq!(redis.cli(&["GET", &shards]), "4");
}

/// Starts a service on `redis` in the tests' 4 shards, adds item `id` under
/// key k (`what` says what it is, should it fail), and stops the service.
async fn add_once(redis: &RedisServer, id: &str, what: &str) {
    let service = Service::start(support::config(&redis.url(), "")).await;
    let mut client = service.client().await;
    client.add(add("k", id, b"p")).await.expect(what);
    service.stop().await;
}
