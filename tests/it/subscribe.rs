//! Live subscriptions against a real Redis: start positions, cursors, filters,
//! order, and slow subscribers.

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;

use crate::support::scrape::scrape;
use crate::support::{
    Process, RedisServer, Service, add, command_calls, config, eventually, next_batch, process_with,
};
use batcher::pb;

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

const ONE_ITEM_BATCHES: &str = r#"
[defaults]
max_items = 1
max_wait = "10m"
"#;

async fn flush_n(
    client: &mut pb::batcher_client::BatcherClient<tonic::transport::Channel>,
    key: &str,
    from: usize,
    n: usize,
) {
    let items = (from..from + n)
        .map(|i| add(key, &i.to_string(), b""))
        .collect();
    client.add_many(pb::AddManyRequest { items }).await.unwrap();
}

/// A live subscription to every key, from now on.
async fn every_batch(
    client: &mut pb::batcher_client::BatcherClient<tonic::transport::Channel>,
) -> tonic::Streaming<pb::Batch> {
    subscribe_after(client, "").await
}

/// A live subscription to every key, after `after` (a cursor, or "0").
async fn subscribe_after(
    client: &mut pb::batcher_client::BatcherClient<tonic::transport::Channel>,
    after: &str,
) -> tonic::Streaming<pb::Batch> {
    client
        .subscribe(pb::SubscribeRequest {
            after: after.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

fn id_of(batch: &pb::Batch) -> usize {
    batch.items[0].id.clone().parse().unwrap()
}

/// after="" gets only batches flushed from now on; after="0" replays every retained batch first.
#[tokio::test]
async fn start_positions() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), ONE_ITEM_BATCHES)).await;
    let mut client = service.client().await;
    flush_n(&mut client, "k", 0, 5).await;
    let mut from_now = every_batch(&mut client).await;
    let mut from_zero = subscribe_after(&mut client, "0").await;
    flush_n(&mut client, "k", 5, 2).await;
    let got: Vec<usize> = [
        next_batch(&mut from_now).await,
        next_batch(&mut from_now).await,
    ]
    .iter()
    .map(id_of)
    .collect();
    assert_eq!(got, vec![5, 6]);
    let mut replay = Vec::new();
    for _ in 0..7 {
        replay.push(id_of(&next_batch(&mut from_zero).await));
    }
    assert_eq!(
        replay,
        (0..7).collect::<Vec<_>>(),
        "every batch once, in flush order"
    );
    service.stop().await;
}

/// Resuming with the last cursor yields exactly the batches not yet received, none twice.
#[tokio::test]
async fn cursor_resumes_exactly() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), ONE_ITEM_BATCHES)).await;
    let mut client = service.client().await;
    let mut stream = subscribe_after(&mut client, "0").await;
    // Spread over keys so that every shard has batches.
    for key in ["a", "b", "c", "d", "e", "f"] {
        flush_n(&mut client, key, 0, 10).await;
    }
    let mut seen = HashSet::new();
    let mut cursor = String::new();
    for _ in 0..25 {
        let batch = next_batch(&mut stream).await;
        assert!(seen.insert(batch.id.clone()));
        cursor = batch.cursor;
    }
    drop(stream);
    for key in ["a", "b", "c", "d", "e", "f"] {
        flush_n(&mut client, key, 10, 5).await;
    }
    let mut resumed = subscribe_after(&mut client, &cursor).await;
    for _ in 0..(90 - 25) {
        let batch = next_batch(&mut resumed).await;
        assert!(
            seen.insert(batch.id.clone()),
            "batch {} delivered twice",
            batch.id
        );
    }
    assert_eq!(seen.len(), 90);
    // Nothing more: a marker batch flushed now is the very next one.
    flush_n(&mut client, "marker", 0, 1).await;
    assert_eq!(next_batch(&mut resumed).await.key, "marker");
    service.stop().await;
}

/// Filters deliver the exact keys plus the prefixes, and nothing else.
#[tokio::test]
async fn filters_select_keys_and_prefixes() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), ONE_ITEM_BATCHES)).await;
    let mut client = service.client().await;
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            keys: vec!["north".into()],
            key_prefixes: vec!["south-".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for key in [
        "east",
        "north",
        "northwest",
        "south-1",
        "south",
        "south-2",
        "end",
    ] {
        flush_n(&mut client, key, 0, 1).await;
    }
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.push(next_batch(&mut stream).await.key);
    }
    keys.sort();
    assert_eq!(keys, ["north", "south-1", "south-2"]);
    let mut end = client
        .subscribe(pb::SubscribeRequest {
            keys: vec!["marker".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    flush_n(&mut client, "marker", 0, 1).await;
    next_batch(&mut end).await;
    flush_n(&mut client, "north", 1, 1).await;
    assert_eq!(
        next_batch(&mut stream).await.key,
        "north",
        "nothing unmatched came in between"
    );
    service.stop().await;
}

/// A subscriber that stops reading falls behind the in-process fan-out but
/// still receives every batch exactly once, in order, while others keep up.
#[tokio::test]
async fn slow_subscriber_catches_up_without_blocking_others() {
    let redis = RedisServer::start();
    let extra = format!("{ONE_ITEM_BATCHES}\n[subscriptions]\nbuffer = 1\n");
    let service = Service::start(config(&redis.url(), &extra)).await;
    let mut client = service.client().await;
    let mut slow = every_batch(&mut client).await;
    let mut fast = every_batch(&mut client).await;
    let total = 6000; // more than the fan-out channel holds
    let reader = tokio::spawn(async move {
        let mut n = 0;
        while n < total {
            next_batch(&mut fast).await;
            n += 1;
        }
        n
    });
    for chunk in 0..(total / 1000) {
        flush_n(&mut client, "k", chunk * 1000, 1000).await;
    }
    assert_eq!(
        reader.await.unwrap(),
        total,
        "the fast subscriber got everything"
    );
    for expected in 0..total {
        assert_eq!(id_of(&next_batch(&mut slow).await), expected);
    }
    service.stop().await;
}

/// A cursor stays valid after retention has trimmed its batches away: the
/// resumed subscription picks up with the next batch. Retention is 2 s, so
/// that the next batch is read before it is trimmed too, however loaded the
/// machine.
#[tokio::test]
async fn cursor_survives_trimming() {
    let redis = RedisServer::start();
    let extra =
        format!("{ONE_ITEM_BATCHES}\n[subscriptions]\nretention = \"2s\"\ntrim_every = \"20ms\"\n");
    let service = Service::start(config(&redis.url(), &extra)).await;
    let mut client = service.client().await;
    let mut stream = every_batch(&mut client).await;
    flush_n(&mut client, "k", 0, 3).await;
    let mut cursor = String::new();
    for _ in 0..3 {
        cursor = next_batch(&mut stream).await.cursor;
    }
    drop(stream);
    support::eventually("the batches to be trimmed", || {
        let len = support::stream_len(&redis);
        async move { (len == 0).then_some(()) }
    })
    .await;
    let mut resumed = client
        .subscribe(pb::SubscribeRequest {
            after: cursor,
            ..Default::default()
        })
        .await
        .expect("a trimmed-away cursor is still a known cursor")
        .into_inner();
    flush_n(&mut client, "k", 3, 1).await;
    assert_eq!(id_of(&next_batch(&mut resumed).await), 3);
    service.stop().await;
}

/// A live subscriber that connects while the shard tails cannot reach Redis
/// yet still gets a batch flushed before they start.
#[tokio::test]
async fn nothing_is_missed_while_the_tails_start() {
    let redis = RedisServer::start();
    let mut admin = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // This connection and the service's main one; the tails' own
    // connections are refused until the limit is raised.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxclients", "2"])
        .query(&mut admin)
        .unwrap();
    let service = Service::start(config(&redis.url(), ONE_ITEM_BATCHES)).await;
    let mut client = service.client().await;
    let mut stream = every_batch(&mut client).await;
    flush_n(&mut client, "early", 0, 1).await;
    // The tails have really been refused: Redis counts its refusals. (Over
    // the admin connection: at the limit, a redis-cli is refused too.)
    let mut rejected = || {
        let stats: String = redis::cmd("INFO").arg("stats").query(&mut admin).unwrap();
        let line = stats
            .lines()
            .find_map(|l| l.strip_prefix("rejected_connections:"));
        let count = line.expect("INFO stats has rejected_connections").trim();
        count.parse::<u64>().unwrap()
    };
    eventually("a tail's connection to be refused", || {
        let refused = rejected() > 0;
        async move { refused.then_some(()) }
    })
    .await;
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxclients", "1000"])
        .query(&mut admin)
        .unwrap();
    flush_n(&mut client, "late", 1, 1).await;
    let keys = [
        next_batch(&mut stream).await.key,
        next_batch(&mut stream).await.key,
    ];
    assert_eq!(keys, ["early", "late"]);
    service.stop().await;
}

/// `batcher serve` on `redis` as a child process, so that its metrics (the
/// subscriber gauge above all) are its own: in this process the recorder is
/// shared by every test's service. Returns it, its HTTP address and a client.
async fn own_process(redis: &RedisServer, dir: &std::path::Path) -> (Process, SocketAddr, Client) {
    let text = support::config_text(&redis.url(), ONE_ITEM_BATCHES);
    let mut process = process_with(dir, &text).await;
    let http = process.http_addr().await;
    let client = support::client(process.addr).await;
    (process, http, client)
}

/// Waits until the instance serving `/metrics` at `http` has no live
/// subscriber left (its gauge).
async fn no_live_subscriber(http: SocketAddr) {
    eventually("the live subscriber to leave", || async move {
        let live = scrape(http)
            .await
            .value("batcher_subscribers", &[("mode", "live")]);
        (live == Some(0.0)).then_some(())
    })
    .await;
}

/// The shard tails read batches back only while a subscriber listens: no
/// XREAD while the instance only ingests, and none once the last one left
/// beyond the one read each tail may have had in flight.
#[tokio::test]
async fn tails_read_only_while_someone_listens() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (process, http, mut client) = own_process(&redis, dir.path()).await;
    for i in 0..20 {
        flush_n(&mut client, "k", i, 1).await;
    }
    assert_eq!(
        command_calls(&redis, &["xread"]),
        0,
        "the tails read with nobody listening"
    );
    let mut stream = every_batch(&mut client).await;
    flush_n(&mut client, "k", 20, 3).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(id_of(&next_batch(&mut stream).await));
    }
    assert_eq!(got, vec![20, 21, 22]);
    assert!(command_calls(&redis, &["xread"]) > 0);
    drop(stream);
    no_live_subscriber(http).await;
    let before = command_calls(&redis, &["xread"]);
    // One batch a call, each landing on its own: a tail that kept reading
    // would read about one each time.
    for i in 23..83 {
        flush_n(&mut client, "k", i, 1).await;
    }
    let reads = command_calls(&redis, &["xread"]) - before;
    assert!(
        reads <= 4,
        "{reads} reads after the last subscriber left (4 shards)"
    );
    process.stop().await;
}

/// Subscribers that come after the tails stopped, or while they stop, get
/// from their cursor every batch, each once: those flushed while nobody
/// listened (read back from Redis) and those flushed after (from the tails,
/// started anew).
#[tokio::test]
async fn subscribers_after_an_idle_spell_miss_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (process, http, mut client) = own_process(&redis, dir.path()).await;
    let keys = ["a", "b", "c", "d", "e", "f"];
    let mut stream = every_batch(&mut client).await;
    for key in keys {
        flush_n(&mut client, key, 0, 2).await;
    }
    let mut cursor = String::new();
    for _ in 0..12 {
        cursor = next_batch(&mut stream).await.cursor;
    }
    drop(stream);
    no_live_subscriber(http).await;
    // Flushed with nobody listening; then a subscriber from the cursor.
    for key in keys {
        flush_n(&mut client, key, 2, 2).await;
    }
    let mut resumed = subscribe_after(&mut client, &cursor).await;
    for key in keys {
        flush_n(&mut client, key, 4, 2).await;
    }
    let mut seen = HashSet::new();
    for _ in 0..24 {
        let batch = next_batch(&mut resumed).await;
        let item = (batch.key.clone(), id_of(&batch));
        assert!(seen.insert(item.clone()), "{item:?} delivered twice");
    }
    let expected: HashSet<(String, usize)> = keys
        .iter()
        .flat_map(|k| (2..6).map(move |i| (k.to_string(), i)))
        .collect();
    assert_eq!(seen, expected);
    drop(resumed);
    // Subscribers one after another, each from "now", not waiting for the
    // last to be gone: each gets exactly the batches flushed after it came.
    for round in 0..10 {
        let mut stream = every_batch(&mut client).await;
        let key = keys[round % keys.len()];
        flush_n(&mut client, key, 100 + 2 * round, 2).await;
        let got = [
            id_of(&next_batch(&mut stream).await),
            id_of(&next_batch(&mut stream).await),
        ];
        assert_eq!(got, [100 + 2 * round, 101 + 2 * round], "round {round}");
    }
    process.stop().await;
}
