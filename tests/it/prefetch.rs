//! The durable consumers' prefetch limit (`[subscriptions] max_unacked`)
//! against a real Redis: a consumer holds at most that many unacked batches,
//! an ack (through any instance) or a takeover frees its slots, and a slow
//! consumer under steady load is not hit by a redelivery storm.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{RedisServer, Service, add, config, eventually, next_batch};
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;

/// One item per batch; durable subscriptions with this ack timeout and
/// prefetch limit; a metrics listener that cannot collide with other tests.
fn prefetch(ack_timeout: &str, max_unacked: u32) -> String {
    format!(
        "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [subscriptions]\nack_timeout = \"{ack_timeout}\"\nmax_unacked = {max_unacked}\n\
         max_deliveries = 100\n"
    )
}

/// The consumer group of every test but the soak.
const GROUP: &str = "trucks";
/// The soak's consumer group: its lag gauge is its own, although the
/// metrics recorder is shared by every service in this process.
const SOAK_GROUP: &str = "soak";

/// The consumer `consumer` of the group "trucks", through `client`.
async fn join(client: &mut BatcherClient<Channel>, consumer: &str) -> tonic::Streaming<pb::Batch> {
    join_group(client, GROUP, consumer).await
}

/// The consumer `consumer` of `group`, through `client`.
async fn join_group(
    client: &mut BatcherClient<Channel>,
    group: &str,
    consumer: &str,
) -> tonic::Streaming<pb::Batch> {
    let request = pb::SubscribeRequest {
        consumer_group: group.into(),
        consumer: consumer.into(),
        ..Default::default()
    };
    client.subscribe(request).await.unwrap().into_inner()
}

/// Adds `n` items under `key`, each flushed as its own batch; returns the batch ids in order.
async fn flush(client: &mut BatcherClient<Channel>, key: &str, n: usize) -> Vec<String> {
    let items = (0..n)
        .map(|i| add(key, &format!("{key}-{i}"), b""))
        .collect();
    let request = pb::AddManyRequest { items };
    let reply = client.add_many(request).await.unwrap().into_inner();
    let flushed = reply.results.into_iter().map(|r| r.flushed.map(|b| b.id));
    flushed
        .collect::<Option<_>>()
        .expect("max_items = 1 flushes every add")
}

/// Acks batches for the group "trucks"; returns how many were pending.
async fn ack(client: &mut BatcherClient<Channel>, ids: &[String]) -> u32 {
    ack_group(client, GROUP, ids).await
}

/// Acks batches for `group`; returns how many were pending.
async fn ack_group(client: &mut BatcherClient<Channel>, group: &str, ids: &[String]) -> u32 {
    let request = pb::AckRequest {
        consumer_group: group.into(),
        batch_ids: ids.to_vec(),
    };
    client.ack(request).await.unwrap().into_inner().acked
}

/// Receives `n` batches and checks they are `ids`, in order, delivered `count` times.
async fn expect(stream: &mut tonic::Streaming<pb::Batch>, ids: &[String], count: u32) {
    for id in ids {
        let batch = next_batch(stream).await;
        assert_eq!((&batch.id, batch.delivery_count), (id, count));
    }
}

/// Asserts that nothing arrives on `stream` for a while (everything it
/// could get is provably elsewhere by now; this only catches a stray one).
async fn expect_nothing(stream: &mut tonic::Streaming<pb::Batch>) {
    let next = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
    match next {
        Err(_) => {}
        Ok(Ok(Some(batch))) => panic!("unexpected batch {}", batch.id),
        Ok(other) => panic!("the subscription failed or ended: {other:?}"),
    }
}

/// A consumer that does not ack receives exactly max_unacked batches while
/// more wait in the group; acking k of them brings exactly the next k, in
/// order; the rest stay in the group for another consumer.
#[tokio::test]
async fn a_consumer_holds_at_most_max_unacked() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), &prefetch("1h", 4))).await;
    let mut client = service.client().await;
    let mut c1 = join(&mut client, "c1").await;
    let ids = flush(&mut client, "k", 12).await;
    expect(&mut c1, &ids[..4], 1).await;

    // Acked through another connection: the ack wakes the consumer all the same.
    let mut other = service.client().await;
    assert_eq!(ack(&mut other, &ids[..2]).await, 2);
    expect(&mut c1, &ids[4..6], 1).await;
    assert_eq!(ack(&mut client, &ids[2..3]).await, 1);
    expect(&mut c1, &ids[6..7], 1).await;

    // c1 holds 4 again and has not taken the rest: a second consumer gets
    // them, first come, in order.
    let mut c2 = join(&mut client, "c2").await;
    expect(&mut c2, &ids[7..11], 1).await;
    expect_nothing(&mut c1).await;
    assert_eq!(ack(&mut client, &ids[7..8]).await, 1);
    expect(&mut c2, &ids[11..], 1).await;
    expect_nothing(&mut c1).await;
    service.stop().await;
}

/// An ack through another instance frees the consumer's slots (it counts
/// again at the poll bound), and so does a takeover after ack_timeout by a
/// consumer on another instance: the first consumer then gets new batches
/// although it never acked.
#[tokio::test]
async fn acks_and_takeovers_elsewhere_free_slots() {
    let redis = RedisServer::start();
    // The first instance never takes anything over; the second after 300ms.
    let a = Service::start(config(&redis.url(), &prefetch("1h", 2))).await;
    let b = Service::start(config(&redis.url(), &prefetch("300ms", 2))).await;
    let (mut via_a, mut via_b) = (a.client().await, b.client().await);
    let mut c1 = join(&mut via_a, "c1").await;
    let ids = flush(&mut via_a, "k", 3).await;
    expect(&mut c1, &ids[..2], 1).await;
    assert_eq!(ack(&mut via_b, &ids[..1]).await, 1);
    expect(&mut c1, &ids[2..], 1).await;

    // c1 holds ids[1] and ids[2] unacked; c2 takes them over once idle. c2
    // does not ack either, so on a slow machine its own 300 ms may run out
    // before it has both and one comes again: count each id once.
    let mut c2 = join(&mut via_b, "c2").await;
    let mut taken = HashSet::new();
    while taken.len() < 2 {
        let batch = next_batch(&mut c2).await;
        assert!(
            ids[1..].contains(&batch.id),
            "unexpected batch {}",
            batch.id
        );
        assert!(
            batch.delivery_count >= 2,
            "{} reached c2 without a takeover (delivery count {})",
            batch.id,
            batch.delivery_count
        );
        taken.insert(batch.id);
    }
    let more = flush(&mut via_a, "m", 2).await;
    expect(&mut c1, &more, 1).await;
    a.stop().await;
    b.stop().await;
}

/// The soak, scaled down: how many batches a consumer holds unacked at most.
const SOAK_MAX_UNACKED: u32 = 16;
/// Batches flushed per second, by two producers.
const SOAK_FLUSH_RATE: u32 = 200;
/// How long the producers run: short enough that the backlog drains
/// within the wait's deadline on a busy machine.
const SOAK_PRODUCE: Duration = Duration::from_secs(3);
/// Each consumer's simulated work per batch: at most 50 batches/s, a
/// quarter of the flush rate, so together they take half of it.
const SOAK_WORK: Duration = Duration::from_millis(20);

/// What the soak's consumers saw: deliveries per batch id, and the ids whose
/// ack found them pending (acked for the group by that ack).
#[derive(Default)]
struct Seen {
    deliveries: HashMap<String, u32>,
    acked: HashMap<String, u32>,
}

/// A consumer at work: each batch takes `SOAK_WORK`, then is acked.
async fn work(
    mut client: BatcherClient<Channel>,
    mut stream: tonic::Streaming<pb::Batch>,
    seen: Arc<Mutex<Seen>>,
) {
    while let Ok(Some(batch)) = stream.message().await {
        *seen
            .lock()
            .unwrap()
            .deliveries
            .entry(batch.id.clone())
            .or_default() += 1;
        tokio::time::sleep(SOAK_WORK).await;
        let acked = ack_group(&mut client, SOAK_GROUP, std::slice::from_ref(&batch.id)).await;
        *seen.lock().unwrap().acked.entry(batch.id).or_default() += acked;
    }
}

/// The most `batcher_consumer_lag` of the soak's group seen so far.
static MOST_LAG: Mutex<f64> = Mutex::new(0.0);

/// Samples `/metrics` at `http` every 100 ms, keeping the most consumer lag
/// of the soak's group in `MOST_LAG`, until aborted.
async fn watch_lag(http: std::net::SocketAddr) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let scrape = support::scrape::scrape(http).await;
        let lag = scrape.value("batcher_consumer_lag", &[("consumer_group", SOAK_GROUP)]);
        // Absent until the group's first lag sample: no lag seen yet.
        let lag = lag.unwrap_or(0.0);
        let mut most = MOST_LAG.lock().unwrap();
        *most = most.max(lag);
    }
}

/// A producer: every 100ms, one AddMany that flushes `per_tick` batches over
/// 8 keys, until `SOAK_PRODUCE` has passed. Returns the flushed batch ids.
async fn produce(mut client: BatcherClient<Channel>, name: &str, per_tick: usize) -> Vec<String> {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (start, mut flushed, mut seq) = (Instant::now(), Vec::new(), 0);
    while start.elapsed() < SOAK_PRODUCE {
        tick.tick().await;
        let items = (0..per_tick)
            .map(|i| add(&format!("k{}", i % 8), &format!("{name}-{seq}-{i}"), b"x"))
            .collect();
        let reply = client.add_many(pb::AddManyRequest { items }).await.unwrap();
        flushed.extend(
            reply
                .into_inner()
                .results
                .into_iter()
                .filter_map(|r| r.flushed.map(|b| b.id)),
        );
        seq += 1;
    }
    flushed
}

/// Producers at a steady rate and two consumers, on two instances, that
/// together work at half that rate, with an ack_timeout shorter than the
/// backlog takes to drain: the backlog
/// shows as consumer lag in the metrics, after the drain every flushed batch
/// was acked exactly once, and at most 1% of the batches were delivered more
/// than once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumers_under_load_see_no_redelivery_storm() {
    let redis = RedisServer::start();
    let text = prefetch("5s", SOAK_MAX_UNACKED);
    let a = Service::start(config(&redis.url(), &text)).await;
    let b = Service::start(config(&redis.url(), &text)).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    // Both consumers have joined (and so created) the group before anything is flushed.
    let (mut via_a, mut via_b) = (a.client().await, b.client().await);
    let (c1, c2) = (
        join_group(&mut via_a, SOAK_GROUP, "c1").await,
        join_group(&mut via_b, SOAK_GROUP, "c2").await,
    );
    let lag = tokio::spawn(watch_lag(a.http_addr.expect("an http listener")));
    let consumers = [
        tokio::spawn(work(via_a, c1, seen.clone())),
        tokio::spawn(work(via_b, c2, seen.clone())),
    ];
    let per_tick = (SOAK_FLUSH_RATE / 10 / 2) as usize;
    let producers = [
        tokio::spawn(produce(a.client().await, "p1", per_tick)),
        tokio::spawn(produce(b.client().await, "p2", per_tick)),
    ];
    let mut flushed = Vec::new();
    for producer in producers {
        flushed.extend(producer.await.unwrap());
    }
    let drained = Instant::now();
    eventually("every flushed batch to be acked", || {
        let acked = seen
            .lock()
            .unwrap()
            .acked
            .values()
            .filter(|n| **n > 0)
            .count();
        let done = acked == flushed.len();
        async move { done.then_some(()) }
    })
    .await;
    for consumer in consumers {
        consumer.abort();
    }
    lag.abort();
    let _ = lag.await;
    let most_lag = *MOST_LAG.lock().unwrap();
    assert!(most_lag > 0.0, "the backlog never showed as consumer lag");
    a.stop().await;
    b.stop().await;
    let seen = seen.lock().unwrap();
    let twice = seen.deliveries.values().filter(|n| **n > 1).count();
    let share = twice as f64 / flushed.len() as f64;
    println!(
        "flushed {} batches, drained in {:?}; {twice} delivered more than once ({:.2}%)",
        flushed.len(),
        drained.elapsed(),
        share * 100.0
    );
    assert!(
        flushed.iter().all(|id| seen.acked.get(id) == Some(&1)),
        "a batch was not acked exactly once"
    );
    assert_eq!(
        seen.deliveries.len(),
        flushed.len(),
        "only flushed batches are delivered"
    );
    assert!(
        share <= 0.01,
        "{twice} of {} batches delivered more than once",
        flushed.len()
    );
}
