//! The data format marker: a service refuses, with one line that says what
//! it found and what to do, to start on a prefix that holds data in another
//! format, older (unmarked shard keys) or unknown; on an empty prefix it
//! marks the format it writes.

mod support;

use batcher::keys::Keyspace;
use support::redis::RedisServer;
use support::{Service, add, start_error};

/// An empty prefix gets the marker; a prefix holding format 1 (shard keys,
/// no marker) or format 3 refuses the start and is left as it was.
#[tokio::test]
async fn a_prefix_in_another_format_refuses_to_start() {
    let redis = RedisServer::start();
    let marker = Keyspace::new("batcher", 4).format_marker();
    let service = Service::start(support::config(&redis.url(), "")).await;
    let mut client = service.client().await;
    client
        .add(add("k", "1", b"p"))
        .await
        .expect("an add on a fresh prefix");
    assert_eq!(redis.cli(&["GET", &marker]), "2");
    service.stop().await;

    redis.cli(&["SET", &marker, "3"]);
    let msg = start_error(support::config(&redis.url(), "")).await;
    assert!(
        msg.contains("format 3") && msg.contains("format 2"),
        "{msg}"
    );
    assert!(msg.contains("prefix \"batcher\""), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    assert_eq!(
        redis.cli(&["GET", &marker]),
        "3",
        "the marker was overwritten"
    );

    redis.cli(&["DEL", &marker]);
    let due = Keyspace::new("batcher", 4).shard(2).due;
    redis.cli(&["ZADD", &due, "1", "old-group"]);
    let msg = start_error(support::config(&redis.url(), "")).await;
    assert!(msg.contains("format 1"), "{msg}");
    assert_eq!(
        redis.cli(&["EXISTS", &marker]),
        "0",
        "format 1 was marked 2"
    );
}
