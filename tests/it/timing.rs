//! Timeout flushes against a real Redis: never early, on time, woken by local
//! adds, found by other instances, timed by the Redis clock, and the due scan
//! the sweeper wakes by.

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{RedisServer, Service, add, config, next_batch, wait_for_first_sweeps};
use batcher::pb;

fn ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000
}

/// A group flushes by TIMEOUT at opened + max_wait, never early, even when the
/// sweeper's idle bound is a minute: the add that opened it woke the sweeper.
#[tokio::test]
async fn timeout_flush_is_on_time_and_never_early() {
    let redis = RedisServer::start();
    let extra = r#"
[defaults]
max_items = 100
max_wait = "700ms"
[sweeper]
max_sleep = "60s"
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    let mut batches = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    // The sweepers' first scans found nothing; now they sleep for max_sleep.
    wait_for_first_sweeps(&redis).await;
    client.add(add("k", "a", b"")).await.unwrap();
    client.add(add("k", "b", b"")).await.unwrap();
    let batch = next_batch(&mut batches).await;
    assert_eq!(batch.reason, pb::FlushReason::Timeout as i32);
    assert_eq!(batch.items.len(), 2);
    let waited = ms(batch.flushed_at.as_ref().unwrap()) - ms(batch.opened_at.as_ref().unwrap());
    assert!(waited >= 700, "flushed early: after {waited} ms");
    assert!(
        waited < 700 + 1000,
        "flushed {waited} ms after opening, far past max_wait"
    );
    service.stop().await;
}

/// The wait window of [`ANOTHER`], in ms: long enough that the steps
/// between the adds and the check that the groups are still open fit in it
/// on a busy machine.
const ANOTHER_WAIT_MS: i64 = 5000;

const ANOTHER: &str = r#"
[defaults]
max_items = 100
max_wait = "5s"
[sweeper]
max_sleep = "100ms"
"#;

/// Receives three TIMEOUT batches, checks each waited its max_wait plus at
/// most a second, and returns their keys, sorted.
async fn three_timeout_batches(stream: &mut tonic::Streaming<pb::Batch>) -> Vec<String> {
    let mut keys = Vec::new();
    for _ in 0..3 {
        let batch = next_batch(stream).await;
        assert_eq!(batch.reason, pb::FlushReason::Timeout as i32);
        let waited = ms(batch.flushed_at.as_ref().unwrap()) - ms(batch.opened_at.as_ref().unwrap());
        let on_time = ANOTHER_WAIT_MS..ANOTHER_WAIT_MS + 1000;
        assert!(on_time.contains(&waited), "waited {waited} ms");
        keys.push(batch.key);
    }
    keys.sort();
    keys
}

/// Which of the keys a, b and c have an open group in `redis`, read from
/// the store itself, not through a service.
async fn open_keys(redis: &RedisServer) -> Vec<String> {
    let store = support::store(&config(&redis.url(), ""));
    let mut keys = Vec::new();
    for key in ["a", "b", "c"] {
        if store.group(key).await.expect("read a group").is_some() {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// Groups that another running instance opened, and cannot flush (it is
/// frozen with SIGSTOP), are found by a live instance's poll and flushed on time.
#[tokio::test]
async fn a_live_instance_flushes_groups_another_instance_opened() {
    let redis = RedisServer::start();
    let live = Service::start(config(&redis.url(), ANOTHER)).await;
    let mut client = live.client().await;
    let mut batches = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let text = support::config_text(&redis.url(), ANOTHER);
    std::fs::write(&path, text).unwrap();
    let opener = support::serve(&path, dir.path()).start().await;
    let mut opener_client = support::client(opener.addr).await;
    for key in ["a", "b", "c"] {
        opener_client.add(add(key, "1", b"")).await.unwrap();
    }
    // Frozen, the opener can't flush; the live instance gets no local
    // wake-up for groups it did not open, so only its poll can find them.
    opener.signal(libc::SIGSTOP);
    // Still open after the opener froze: the opener did not flush them.
    assert_eq!(
        open_keys(&redis).await,
        ["a", "b", "c"],
        "open when the opener froze"
    );
    assert_eq!(three_timeout_batches(&mut batches).await, ["a", "b", "c"]);
    opener.signal(libc::SIGCONT);
    live.stop().await;
}

/// A service stopped with groups open leaves them open, and the next
/// instance started resumes them and flushes them on time.
#[tokio::test]
async fn a_restarted_service_resumes_open_groups() {
    let redis = RedisServer::start();
    let first = Service::start(config(&redis.url(), ANOTHER)).await;
    let mut client = first.client().await;
    for key in ["a", "b", "c"] {
        client.add(add(key, "1", b"")).await.unwrap();
    }
    first.stop().await;
    // Still open once the first instance has stopped: only the next one
    // can flush them.
    assert_eq!(
        open_keys(&redis).await,
        ["a", "b", "c"],
        "open after the stop"
    );

    let second = Service::start(config(&redis.url(), ANOTHER)).await;
    let mut client = second.client().await;
    let mut batches = client
        .subscribe(pb::SubscribeRequest {
            after: "0".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(three_timeout_batches(&mut batches).await, ["a", "b", "c"]);
    second.stop().await;
}

/// Due times come from Redis's clock: with Redis an hour ahead of this host,
/// groups open at Redis's time and still flush after max_wait, not at once and
/// not an hour late.
#[tokio::test]
async fn due_times_follow_the_redis_clock() {
    let redis = RedisServer::builder().clock_skew_secs(3600).start();
    let extra = r#"
[defaults]
max_items = 100
max_wait = "1s"
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    let mut batches = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    client.add(add("k", "a", b"")).await.unwrap();
    let group = client
        .get_group(pb::GetGroupRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    let host_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let skew = ms(group.opened_at.as_ref().unwrap()) - host_now;
    assert!(
        (3_500_000..3_700_000).contains(&skew),
        "opened_at is {skew} ms off the host clock"
    );
    let started = std::time::Instant::now();
    let batch = next_batch(&mut batches).await;
    assert_eq!(batch.reason, pb::FlushReason::Timeout as i32);
    let waited = ms(batch.flushed_at.as_ref().unwrap()) - ms(batch.opened_at.as_ref().unwrap());
    assert!(
        (1000..2000).contains(&waited),
        "waited {waited} ms by the Redis clock"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    service.stop().await;
}

/// The due scan names the groups that are due and those that fall due next
/// (all of them that share that time), which the sweeper flushes as soon as
/// it wakes; a removed group drops out of both.
#[tokio::test]
async fn the_due_scan_names_what_falls_due_next() {
    use batcher::policy::Policy;
    use batcher::store::NewItem;

    let redis = RedisServer::start();
    let mut config = config(&redis.url(), "");
    config.redis.shards = std::num::NonZeroU16::MIN;
    let store = support::store(&config);
    let item = |key: &str, wait_ms: u64| NewItem {
        key: key.into(),
        item: batcher::batch::Item::new("i", "p"),
        policy: Policy::basic(100, Duration::from_millis(wait_ms), None),
        close: false,
        requeue_of: None,
    };
    // One call, so one Redis clock reading: b and c fall due together.
    let hour = 3_600_000;
    let items = vec![item("a", hour), item("c", 2 * hour), item("b", 2 * hour)];
    store.add(items).await.unwrap();
    store.add(vec![item("d", 1)]).await.unwrap();

    let scan = support::eventually("d to fall due", || async {
        let scan = store.due_groups(0, 10).await.unwrap();
        (scan.keys == ["d"]).then_some(scan)
    })
    .await;
    assert_eq!(scan.next_keys, ["a"]);
    let wait = scan.next_due_ms.unwrap() - scan.now_ms;
    assert!(wait > hour - 60_000 && wait <= hour, "{wait}");

    store.remove("a", b"i").await.unwrap();
    store.remove("d", b"i").await.unwrap();
    let scan = store.due_groups(0, 10).await.unwrap();
    assert!(scan.keys.is_empty(), "{:?}", scan.keys);
    assert_eq!(scan.next_keys, ["b", "c"]);
    let wait = scan.next_due_ms.unwrap() - scan.now_ms;
    assert!(wait > hour && wait <= 2 * hour, "{wait}");
}
