//! One deadline per call: with Redis refusing connections or hung
//! (SIGSTOP), callers under load get UNAVAILABLE within the deadline plus a
//! margin, health shows NOT_SERVING and then SERVING, and nothing accepted is
//! lost; a client's shorter `grpc-timeout` is honoured; an add whose
//! deadline passed while it queued behind a call in flight is never written;
//! adds that queued behind a call in flight go out in the next rounds, at
//! most 1000 items a call and each part whole, the shards of a round in one
//! call.

use std::time::{Duration, Instant};

use crate::support::cluster::wait_all_flushed;
use crate::support::load::{Load, placement};
use crate::support::{
    Paused, RedisServer, Service, add, all_batches, assert_error_info, command_calls, config,
    eventually, store, wait_health,
};
use batcher::batch::Item;
use batcher::config::Config;
use batcher::pb;
use batcher::policy::Policy;
use batcher::store::{Deadline, NewItem, StoreError};
use tonic::{Code, Request};
use tonic_health::pb::health_check_response::ServingStatus;

/// The configured deadline of these tests.
const DEADLINE: Duration = Duration::from_secs(1);
/// How much later than the deadline a failure may come, on a busy machine
/// (two cores shared with other tests and builds): generous, yet shorter
/// than the outages these tests make, so a call that waited one out fails
/// the bound.
const MARGIN: Duration = Duration::from_secs(2);
/// Groups of up to 20 items, flushed 300 ms after they open.
const POLICY: &str = "[defaults]\nmax_items = 20\nmax_wait = \"300ms\"\n\
                      [sweeper]\nmax_sleep = \"100ms\"\n";
/// Callers adding at once.
const CALLERS: usize = 6;
/// Adds answered between two steps of a test.
const STEADY: usize = 200;

/// The tests' config: [`POLICY`] and a deadline of [`DEADLINE`].
fn deadline_config(redis: &RedisServer) -> Config {
    let mut config = config(&redis.url(), POLICY);
    config.redis.response_timeout = DEADLINE;
    config
}

/// The service under [`CALLERS`] callers adding without pause.
async fn start_load(config: &Config) -> (Service, Load) {
    let service = Service::start(config.clone()).await;
    let mut clients = Vec::new();
    for _ in 0..CALLERS {
        clients.push(service.client().await);
    }
    (service, Load::start(clients, 8))
}

/// Stops the load, waits for every group to flush, and checks what the
/// callers of the `outage` test were told: only UNAVAILABLE failures, each
/// within the deadline plus the margin, and every acknowledged item in
/// exactly one batch.
async fn settle(service: Service, load: Load, config: &Config, outage: &str) {
    let tally = load.finish().await;
    wait_all_flushed(&service.client().await).await;
    let batches = all_batches(&store(config)).await;
    service.stop().await;
    assert!(tally.other_errors.is_empty(), "{:?}", tally.other_errors);
    assert!(tally.unavailable > 0, "the outage was never seen");
    assert_eq!(tally.gave_up, 0);
    assert!(
        tally.slowest_failure < DEADLINE + MARGIN,
        "a call took {:?} to fail",
        tally.slowest_failure
    );
    let placed = placement(&tally, &batches);
    assert_eq!((placed.lost, placed.duplicated, placed.unknown), (0, 0, 0));
    eprintln!(
        "{outage}: {} UNAVAILABLE, slowest failure {:?}, longest outage {:?}, {} acknowledged",
        tally.unavailable,
        tally.slowest_failure,
        tally.longest_outage,
        tally.acknowledged.len()
    );
}

/// Redis killed under load (it refuses connections): callers get UNAVAILABLE
/// within the deadline, health shows NOT_SERVING, and after a restart from
/// its AOF health shows SERVING and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_fail_within_the_deadline() {
    let mut redis = RedisServer::start();
    let config = deadline_config(&redis);
    let (service, load) = start_load(&config).await;
    load.wait_answered(STEADY).await;
    redis.kill();
    load.wait_calls(50).await;
    wait_health(service.addr, ServingStatus::NotServing).await;
    redis.restart();
    load.wait_answered(STEADY).await;
    wait_health(service.addr, ServingStatus::Serving).await;
    settle(service, load, &config, "refused").await;
}

/// Redis hung (SIGSTOP) under load: callers get UNAVAILABLE within the
/// deadline instead of waiting for it, health shows NOT_SERVING; after
/// SIGCONT health shows SERVING and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_fails_within_the_deadline() {
    let redis = RedisServer::start();
    let config = deadline_config(&redis);
    let (service, load) = start_load(&config).await;
    load.wait_answered(STEADY).await;
    let paused = Paused::new(&redis);
    let paused_at = Instant::now();
    load.wait_calls(2 * CALLERS).await;
    wait_health(service.addr, ServingStatus::NotServing).await;
    load.wait_calls(2 * CALLERS).await;
    // Hung longer than a failure may take: a call that waited for Redis
    // instead of its deadline would fail the bound.
    eventually("Redis to be hung past the bound of a failure", || async {
        (paused_at.elapsed() > DEADLINE + MARGIN).then_some(())
    })
    .await;
    drop(paused);
    load.wait_answered(STEADY).await;
    wait_health(service.addr, ServingStatus::Serving).await;
    settle(service, load, &config, "hung").await;
}

/// With Redis hung and a configured deadline of 10 s, calls whose client
/// `grpc-timeout` is 1 s fail UNAVAILABLE (REDIS_TIMEOUT) a little before
/// 1 s: an add, a read, and a Subscribe that joins a consumer group.
#[tokio::test]
async fn shorter_client_timeout_is_honoured() {
    let redis = RedisServer::start();
    let mut config = config(&redis.url(), "");
    config.redis.response_timeout = Duration::from_secs(10);
    let service = Service::start(config).await;
    let mut client = service.client().await;
    client.add(add("k", "before", b"")).await.unwrap();
    let timeout = Duration::from_secs(1);

    let _paused = Paused::new(&redis);
    let started = Instant::now();
    let status = client
        .add(within(add("k", "during", b""), timeout))
        .await
        .unwrap_err();
    check_timed_out(&status, started, timeout);

    let started = Instant::now();
    let read = pb::GetGroupRequest { key: "k".into() };
    let status = client.get_group(within(read, timeout)).await.unwrap_err();
    check_timed_out(&status, started, timeout);

    let started = Instant::now();
    let join = pb::SubscribeRequest {
        consumer_group: "g".into(),
        consumer: "c".into(),
        ..Default::default()
    };
    let status = client.subscribe(within(join, timeout)).await.unwrap_err();
    check_timed_out(&status, started, timeout);
}

/// `message` as a request with a client deadline of `timeout`.
fn within<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Asserts that `status` is the deadline's UNAVAILABLE, which came after
/// about `timeout` since `started`.
#[track_caller]
fn check_timed_out(status: &tonic::Status, started: Instant, timeout: Duration) {
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().starts_with("redis did not answer within "),
        "{status:?}"
    );
    assert_error_info(status, "REDIS_TIMEOUT");
    assert!(
        took >= timeout * 8 / 10 && took < timeout + MARGIN,
        "failed after {took:?}"
    );
}

/// An add whose deadline passes while it waits in its shard's queue behind
/// a call in flight is dropped when the writer takes it, never written, and
/// its caller is told it timed out; the call ahead of it lands.
#[tokio::test]
async fn expired_queued_add_is_never_written() {
    let redis = RedisServer::start();
    let config = config(&redis.url(), "");
    let store = std::sync::Arc::new(store(&config));
    let item = |id: &str| NewItem {
        key: "k".into(),
        item: Item::new(id, ""),
        policy: Policy::basic(10, Duration::from_secs(60), None),
        close: false,
        requeue_of: None,
    };
    // The function loaded and the format checked, so the next call is one
    // command.
    let live = || Some(Deadline::after(Duration::from_secs(10)));
    store.add_within(vec![item("warm")], live()).await.unwrap();

    let paused = Paused::new(&redis);
    let ahead = tokio::spawn({
        let (store, first) = (store.clone(), vec![item("first")]);
        async move { store.add_within(first, live()).await }
    });
    eventually("the call ahead to reach the stopped Redis", || async {
        unread_by_redis(redis.port()).then_some(())
    })
    .await;
    let short = Deadline::after(Duration::from_millis(300));
    let queued = tokio::spawn({
        let (store, late) = (store.clone(), vec![item("late")]);
        async move { store.add_within(late, Some(short)).await }
    });
    // The event is the clock passing the queued add's deadline.
    tokio::time::sleep_until(short.at).await;
    drop(paused);

    ahead.await.unwrap().expect("the call ahead lands");
    let err = queued.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");
    assert_eq!(err.to_string(), "redis did not answer within 300ms");
    let group = store.group("k").await.unwrap().expect("an open group");
    let ids: Vec<&[u8]> = group.items.iter().map(|i| i.id.as_slice()).collect();
    assert_eq!(ids, [b"warm".as_slice(), b"first"]);
}

/// Parts that queue behind a call in flight go out in the next rounds, each
/// part whole, in order, and at most 1000 items a call: three parts of 600
/// items of one key, queued behind a hung Redis, take two more add calls
/// (two parts, then the third), and the group holds every item in order.
#[tokio::test]
async fn queued_parts_go_out_in_rounds_of_at_most_1000_items() {
    let redis = RedisServer::start();
    let mut config = config(&redis.url(), "");
    config.redis.response_timeout = Duration::from_secs(30);
    let room = std::num::NonZeroUsize::new(5000).unwrap();
    let store = std::sync::Arc::new(store(&config).with_max_queued_adds(room));
    let part = |ids: Vec<String>| -> Vec<NewItem> {
        let item = |id: &String| NewItem {
            key: "k".into(),
            item: Item::new(id.as_str(), ""),
            policy: Policy::basic(5000, Duration::from_secs(3600), None),
            close: false,
            requeue_of: None,
        };
        ids.iter().map(item).collect()
    };
    store.add(part(vec!["warm".into()])).await.unwrap();
    // The store alone runs no sweeper: every FCALL from now on is an add.
    let calls = command_calls(&redis, &["fcall"]);

    let paused = Paused::new(&redis);
    let ahead = tokio::spawn({
        let (store, first) = (store.clone(), part(vec!["first".into()]));
        async move { store.add(first).await }
    });
    eventually("the call ahead to reach the stopped Redis", || async {
        unread_by_redis(redis.port()).then_some(())
    })
    .await;
    let ids = |p: usize| (0..600).map(|i| format!("p{p}-{i:03}")).collect::<Vec<_>>();
    let parts: Vec<_> = (0..3)
        .map(|p| {
            let (store, items) = (store.clone(), part(ids(p)));
            tokio::spawn(async move { store.add(items).await })
        })
        .collect();
    // This test's runtime has one thread: a yield runs the three tasks up
    // to their wait for the writer, so all three parts are queued.
    tokio::task::yield_now().await;
    drop(paused);

    ahead.await.unwrap().expect("the call ahead lands");
    for part in parts {
        let report = part.await.unwrap().expect("a queued part lands");
        assert_eq!(report.results.len(), 600);
    }
    assert_eq!(
        command_calls(&redis, &["fcall"]) - calls,
        3,
        "the call ahead alone, then parts 1 and 2, then part 3"
    );
    let group = store.group("k").await.unwrap().expect("an open group");
    let held: Vec<String> = (group.items.iter())
        .map(|i| String::from_utf8_lossy(&i.id).into_owned())
        .collect();
    let mut expected = vec!["warm".to_string(), "first".to_string()];
    expected.extend((0..3).flat_map(ids));
    assert_eq!(held, expected);
}

/// Adds of several shards of one lane that queue behind a call in flight go
/// out in one add call, a section per shard: four keys of the two shards of
/// lane 0, queued behind a hung Redis, take one more call, not two, and
/// each group holds its own items and no other's.
#[tokio::test]
async fn one_round_sends_its_shards_in_one_call() {
    let redis = RedisServer::start();
    let mut config = config(&redis.url(), "");
    config.redis.response_timeout = Duration::from_secs(30);
    let store = std::sync::Arc::new(store(&config));
    // Two keys of shard 0 and two of shard 2: the tests' 4 shards make
    // lane 0 of shards 0 and 2.
    let keyspace = store.keyspace();
    let keys: Vec<String> = [0u16, 0, 2, 2]
        .iter()
        .enumerate()
        .map(|(nth, &shard)| {
            (0..10_000)
                .map(|n| format!("area-{n}"))
                .filter(|key| keyspace.shard_of(key) == shard)
                .nth(nth % 2)
                .expect("a key of the shard")
        })
        .collect();
    let adds = |key: &str, ids: &[&str]| -> Vec<NewItem> {
        let item = |id: &&str| NewItem {
            key: key.into(),
            item: Item::new(*id, ""),
            policy: Policy::basic(3, Duration::from_secs(3600), None),
            close: false,
            requeue_of: None,
        };
        ids.iter().map(item).collect()
    };
    store.add(adds(&keys[0], &["warm"])).await.unwrap();
    let calls = command_calls(&redis, &["fcall"]);

    let paused = Paused::new(&redis);
    let ahead = tokio::spawn({
        let (store, first) = (store.clone(), adds(&keys[0], &["first"]));
        async move { store.add(first).await }
    });
    eventually("the call ahead to reach the stopped Redis", || async {
        unread_by_redis(redis.port()).then_some(())
    })
    .await;
    // Each key gets two items; the first key's group fills (3) and flushes.
    let queued: Vec<_> = keys
        .iter()
        .map(|key| {
            let items = adds(key, &[&format!("{key}-a"), &format!("{key}-b")]);
            let store = store.clone();
            tokio::spawn(async move { store.add(items).await })
        })
        .collect();
    // This test's runtime has one thread: a yield runs the tasks up to
    // their wait for the writer, so all of them are queued.
    tokio::task::yield_now().await;
    drop(paused);

    ahead.await.unwrap().expect("the call ahead lands");
    let mut flushed = Vec::new();
    for add in queued {
        let report = add.await.unwrap().expect("a queued add lands");
        assert_eq!(report.results.len(), 2);
        flushed.extend(report.results.into_iter().flat_map(|r| r.flushed));
    }
    assert_eq!(
        command_calls(&redis, &["fcall"]) - calls,
        2,
        "the call ahead alone, then both shards in one call"
    );
    let ids = |items: &[Item]| -> Vec<String> {
        (items.iter())
            .map(|i| String::from_utf8_lossy(&i.id).into_owned())
            .collect()
    };
    assert_eq!(flushed.len(), 1, "the first key's group filled");
    assert_eq!(flushed[0].key, keys[0]);
    let first = format!("{}-a", keys[0]);
    assert_eq!(ids(&flushed[0].items), ["warm", "first", first.as_str()]);
    let rest = format!("{}-b", keys[0]);
    let group = store.group(&keys[0]).await.unwrap().expect("an open group");
    assert_eq!(ids(&group.items), [rest]);
    for key in &keys[1..] {
        let group = store.group(key).await.unwrap().expect("an open group");
        assert_eq!(ids(&group.items), [format!("{key}-a"), format!("{key}-b")]);
    }
}

/// Whether a connection to the Redis on `port` holds bytes Redis has not
/// read (from the kernel's table of IPv4 TCP sockets): a command sent to a
/// stopped Redis.
fn unread_by_redis(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields[1].rsplit(':').next();
        let rx_queue = fields[4].rsplit(':').next();
        // Established connections only ("01"): a listening socket's queue
        // counts connections not yet accepted, which carry no command.
        local_port.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
            && fields[3] == "01"
            && rx_queue.is_some_and(|q| !q.trim_start_matches('0').is_empty())
    })
}
