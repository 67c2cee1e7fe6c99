//! A rolling upgrade, as docs/operations.md ("Rolling them") describes it:
//! three instances on one Redis, each in turn stopped with SIGTERM and
//! started again, twice around, under load from producers behind a load
//! balancer that follows the instances' health, as a Kubernetes Service
//! follows readiness. The producers retry only UNAVAILABLE, on another
//! instance, and the live subscriber resumes by cursor on another instance
//! only when its stream ends UNAVAILABLE: the drain (docs/operations.md,
//! "Drain") must give them nothing else, and no add may take a second.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::load::{ItemRef, Placement, Tally, placement};
use crate::support::{
    DEADLINE, Process, RedisServer, add, all_batches, channel, config, config_text, eventually,
    process_with, serve, store, wait_health,
};
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Groups of up to 10 items, flushed 300 ms after they open. A drain serves
/// on for 1 s with health NOT_SERVING: ten of the balancer's probe periods.
const SETTINGS: &str = "drain_delay = \"1s\"\ndrain_timeout = \"5s\"\n\
                        [defaults]\nmax_items = 10\nmax_wait = \"300ms\"\n\
                        [sweeper]\nmax_sleep = \"100ms\"\n";
const INSTANCES: usize = 3;
const PRODUCERS: usize = 8;
/// Keys the producers spread their adds over.
const KEYS: usize = 6;
/// Times around the instances.
const ROUNDS: usize = 2;
/// Answered adds to wait for before each restart, and after the last.
const STEADY: usize = 150;
/// The deadline of every add, kept by the client: a drain must never make
/// an add take that long.
const CALL_DEADLINE: Duration = Duration::from_secs(1);
/// How often the balancer probes each instance's health.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Where each instance serves now, and whether its health said SERVING at
/// the balancer's last probe, as a load balancer lists them: an instance
/// started again serves on a new port.
#[derive(Clone, Default)]
struct Endpoints(Arc<Mutex<Vec<(SocketAddr, bool)>>>);

impl Endpoints {
    fn new(addrs: Vec<SocketAddr>) -> Endpoints {
        let slots = addrs.into_iter().map(|addr| (addr, true)).collect();
        Endpoints(Arc::new(Mutex::new(slots)))
    }

    /// The `n`th ready instance, round the ready ones (any instance when
    /// none is ready).
    fn pick(&self, n: usize) -> SocketAddr {
        let slots = self.0.lock().unwrap();
        let ready: Vec<SocketAddr> = slots.iter().filter(|s| s.1).map(|s| s.0).collect();
        match ready.is_empty() {
            true => slots[n % slots.len()].0,
            false => ready[n % ready.len()],
        }
    }

    fn replace(&self, instance: usize, addr: SocketAddr) {
        self.0.lock().unwrap()[instance] = (addr, false);
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.0.lock().unwrap().iter().map(|s| s.0).collect()
    }

    /// Sets whether the instance at `addr` is ready, if it is still listed.
    fn set_ready(&self, addr: SocketAddr, ready: bool) {
        let mut slots = self.0.lock().unwrap();
        if let Some(slot) = slots.iter_mut().find(|s| s.0 == addr) {
            slot.1 = ready;
        }
    }
}

/// The load balancer's probes: every [`PROBE_EVERY`], each listed instance's
/// gRPC health, each on a connection of its own; an instance is ready while
/// its probe answers SERVING within the period.
async fn balance(endpoints: Endpoints, stop: CancellationToken) {
    let mut probes: HashMap<SocketAddr, HealthClient<Channel>> = HashMap::new();
    while !stop.is_cancelled() {
        for addr in endpoints.addrs() {
            let health = probes
                .entry(addr)
                .or_insert_with(|| HealthClient::new(channel(addr)));
            let service = "batcher.v1.Batcher".to_owned();
            let check = health.check(HealthCheckRequest { service });
            let status = tokio::time::timeout(PROBE_EVERY, check).await;
            let ready =
                matches!(status, Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32);
            endpoints.set_ready(addr, ready);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

/// What the producers were told.
#[derive(Default)]
struct Told {
    /// Items whose add was answered: every item, in the end.
    answered: Mutex<HashSet<ItemRef>>,
    count: AtomicUsize,
    /// Items answered only after a failed call.
    retried: AtomicUsize,
    /// Of those, the ones answered DUPLICATE: the failed call had landed.
    duplicate: AtomicUsize,
    /// Failed calls, by gRPC code, and whether the client's transport
    /// failed them (the connection closed under the call) rather than the
    /// service.
    failures: Mutex<HashMap<(tonic::Code, bool), usize>>,
    /// Failures other than UNAVAILABLE (a call past its deadline counts as
    /// DEADLINE_EXCEEDED), in full.
    odd: Mutex<Vec<String>>,
    /// The longest an answered add took.
    slowest: Mutex<Duration>,
    stop: AtomicBool,
}

/// Producers adding distinct items, each add until answered: a failed call
/// is repeated with the same id on the next instance.
struct Producers {
    told: Arc<Told>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Producers {
    fn start(endpoints: &Endpoints) -> Producers {
        let told = Arc::new(Told::default());
        let tasks = (0..PRODUCERS)
            .map(|p| tokio::spawn(produce(endpoints.clone(), p, told.clone())))
            .collect();
        Producers { told, tasks }
    }

    /// Waits until `more` further adds have been answered.
    async fn wait_answered(&self, more: usize) {
        let target = self.told.count.load(Ordering::SeqCst) + more;
        eventually(&format!("{more} more answered adds"), || {
            let done = self.told.count.load(Ordering::SeqCst) >= target;
            async move { done.then_some(()) }
        })
        .await;
    }

    /// Stops the producers once their current item is answered.
    async fn finish(self) -> Arc<Told> {
        self.told.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("a producer did not stop")
                .expect("a producer panicked");
        }
        self.told
    }
}

/// Producer `p`: `p<p>-<i>` under `zone-<i % KEYS>`, first through instance
/// `(p + i) % INSTANCES`.
async fn produce(endpoints: Endpoints, p: usize, told: Arc<Told>) {
    let mut clients: HashMap<SocketAddr, BatcherClient<Channel>> = HashMap::new();
    for i in 0.. {
        if told.stop.load(Ordering::SeqCst) {
            return;
        }
        let (key, id) = (format!("zone-{}", i % KEYS), format!("p{p}-{i}"));
        let asked = Instant::now();
        for attempt in 0.. {
            assert!(asked.elapsed() < DEADLINE, "{key}/{id} went unanswered");
            let addr = endpoints.pick(p + i + attempt);
            let client = clients
                .entry(addr)
                .or_insert_with(|| BatcherClient::new(channel(addr)));
            let mut request = tonic::Request::new(add(&key, &id, b"payload"));
            request.set_timeout(CALL_DEADLINE);
            let sent = Instant::now();
            let reply = tokio::time::timeout(CALL_DEADLINE, client.add(request)).await;
            let reply = reply.unwrap_or_else(|_| {
                Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {CALL_DEADLINE:?}"
                )))
            });
            match reply {
                Ok(resp) => {
                    let took = sent.elapsed();
                    let mut slowest = told.slowest.lock().unwrap();
                    *slowest = (*slowest).max(took);
                    drop(slowest);
                    let outcome = resp.into_inner().outcome;
                    if attempt == 0 {
                        assert_eq!(outcome, pb::AddOutcome::Added as i32, "{key}/{id}");
                    } else {
                        told.retried.fetch_add(1, Ordering::SeqCst);
                        if outcome == pb::AddOutcome::Duplicate as i32 {
                            told.duplicate.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    told.answered.lock().unwrap().insert((key, id));
                    told.count.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Err(status) => {
                    let transport = is_transport(&status);
                    let code = status.code();
                    *told
                        .failures
                        .lock()
                        .unwrap()
                        .entry((code, transport))
                        .or_default() += 1;
                    if code != tonic::Code::Unavailable {
                        told.odd
                            .lock()
                            .unwrap()
                            .push(format!("{addr} {key}/{id}: {status:?}"));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// Whether the client's transport failed the call, not the service: the
/// connection closed under it, or the server's GOAWAY refused it (tonic
/// gives such a call UNAVAILABLE, CANCELLED or INTERNAL). Counted apart;
/// only UNAVAILABLE is retried.
fn is_transport(status: &tonic::Status) -> bool {
    let source = std::error::Error::source(status);
    source.is_some_and(|source| source.is::<tonic::transport::Error>())
}

/// What the live subscriber received.
#[derive(Default)]
struct Received {
    /// Batch ids, in the order received.
    ids: Mutex<Vec<String>>,
    /// Times it subscribed again, after its stream ended UNAVAILABLE.
    resumed: AtomicUsize,
    /// Ends of its streams other than UNAVAILABLE, in full.
    odd: Mutex<Vec<String>>,
}

/// A live subscriber from the first batch on. When its stream ends
/// UNAVAILABLE (or subscribing fails UNAVAILABLE) it subscribes on another
/// instance, after the cursor of the last batch it received, each time on
/// a connection of its own. Any other end is recorded, and it resumes all
/// the same so that the test goes on to count what it received.
async fn subscribe(endpoints: Endpoints, received: Arc<Received>, stop: CancellationToken) {
    let mut cursor = "0".to_owned();
    for instance in 0.. {
        let addr = endpoints.pick(instance);
        let mut client = BatcherClient::new(channel(addr));
        let request = pb::SubscribeRequest {
            after: cursor.clone(),
            ..Default::default()
        };
        let ended: Result<(), tonic::Status> = match client.subscribe(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return,
                        next = stream.message() => next,
                    };
                    match next {
                        Ok(Some(batch)) => {
                            received.ids.lock().unwrap().push(batch.id);
                            cursor = batch.cursor;
                        }
                        Ok(None) => break Err(tonic::Status::ok("the stream ended with OK")),
                        Err(status) => break Err(status),
                    }
                }
            }
            Err(status) => Err(status),
        };
        if let Err(status) = ended
            && status.code() != tonic::Code::Unavailable
        {
            received
                .odd
                .lock()
                .unwrap()
                .push(format!("{addr}: {status:?}"));
        }
        received.resumed.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Waits until the subscriber has received `more` further batches.
async fn wait_received(received: &Received, more: usize) {
    let target = received.ids.lock().unwrap().len() + more;
    eventually("the subscriber to receive more batches", || {
        let done = received.ids.lock().unwrap().len() >= target;
        async move { done.then_some(()) }
    })
    .await;
}

/// Stops instance `i` with SIGTERM (it must exit cleanly, in time), starts
/// it again on the same config, points its endpoint at it and waits until
/// it reports SERVING. Returns how long the stop took.
async fn restart(instances: &mut [Option<Process>], i: usize, endpoints: &Endpoints) -> Duration {
    let old = instances[i].take().expect("a running instance");
    let dir = old.log.parent().expect("the log's directory").to_owned();
    let stopping = Instant::now();
    old.stop().await;
    let stopped = stopping.elapsed();
    let new = serve(&dir.join("batcher.toml"), &dir).start().await;
    endpoints.replace(i, new.addr);
    wait_health(new.addr, ServingStatus::Serving).await;
    instances[i] = Some(new);
    stopped
}

/// Three instances on one Redis, each in turn drained with SIGTERM and
/// started again, twice around, under load behind a balancer that follows
/// health: no call fails but UNAVAILABLE, none takes a second, no answered
/// add is lost or doubled, and the live subscriber, resuming by cursor when
/// its stream ends UNAVAILABLE, receives every batch exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_loses_and_doubles_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&redis.url(), SETTINGS);
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        instances.push(Some(process_with(dir.path(), &text).await));
    }
    let addrs = instances.iter().flatten().map(|p| p.addr).collect();
    let endpoints = Endpoints::new(addrs);
    let received = Arc::new(Received::default());
    let stop = CancellationToken::new();
    let balancer = tokio::spawn(balance(endpoints.clone(), stop.clone()));
    let subscriber = tokio::spawn(subscribe(endpoints.clone(), received.clone(), stop.clone()));
    let producers = Producers::start(&endpoints);

    let mut stops = Vec::new();
    for i in (0..INSTANCES).cycle().take(ROUNDS * INSTANCES) {
        producers.wait_answered(STEADY).await;
        wait_received(&received, 1).await;
        stops.push(restart(&mut instances, i, &endpoints).await);
    }
    producers.wait_answered(STEADY).await;
    let told = producers.finish().await;
    let sentinels = flush_all(&endpoints).await;
    let batches = all_batches(&store(&config(&redis.url(), ""))).await;
    eventually("the subscriber to receive every sentinel batch", || {
        let ids = received.ids.lock().unwrap();
        let done = sentinels.iter().all(|(_, batch)| ids.contains(batch));
        async move { done.then_some(()) }
    })
    .await;
    stop.cancel();
    subscriber.await.expect("the subscriber panicked");
    balancer.await.expect("the balancer panicked");

    let mut acknowledged = told.answered.lock().unwrap().clone();
    acknowledged.extend(sentinels.iter().map(|(item, _)| item.clone()));
    let tally = Tally {
        acknowledged,
        ..Tally::default()
    };
    let placed = placement(&tally, &batches);
    let failures = told.failures.lock().unwrap().clone();
    eprintln!(
        "rolling: stops took {stops:?}; {placed:?}; {} items retried, {} of them DUPLICATE; \
         failed calls {failures:?}; the slowest answered add took {:?}; \
         the subscriber resumed {} times",
        told.retried.load(Ordering::SeqCst),
        told.duplicate.load(Ordering::SeqCst),
        told.slowest.lock().unwrap(),
        received.resumed.load(Ordering::SeqCst),
    );
    let clean = Placement {
        acknowledged: placed.acknowledged,
        ..Placement::default()
    };
    assert_eq!(placed, clean, "every answered add in exactly one batch");
    let odd = told.odd.lock().unwrap().clone();
    assert!(
        odd.is_empty(),
        "{failures:?}; adds that failed other than UNAVAILABLE: {odd:#?}"
    );
    let odd = received.odd.lock().unwrap().clone();
    assert!(
        odd.is_empty(),
        "subscription streams that ended other than UNAVAILABLE: {odd:#?}"
    );
    assert_received_once(&received, &batches);
    for instance in instances.into_iter().flatten() {
        instance.stop().await;
    }
}

/// Flushes every key, waits until no group is open, then closes one group
/// on each shard with a sentinel item. Returns the sentinel items and their
/// batches' ids: once a subscriber has received those batches, it has
/// received every batch before them on their shards.
async fn flush_all(endpoints: &Endpoints) -> Vec<(ItemRef, String)> {
    let client = BatcherClient::new(channel(endpoints.pick(0)));
    for key in 0..KEYS {
        let key = format!("zone-{key}");
        client
            .clone()
            .flush(pb::FlushRequest { key })
            .await
            .expect("flush");
    }
    crate::support::cluster::wait_all_flushed(&client).await;
    let mut sentinels = Vec::new();
    for shard in 0..4 {
        let key = sentinel_key(shard);
        let mut request = add(&key, "sentinel", b"");
        request.close_group = true;
        let resp = client.clone().add(request).await.expect("sentinel add");
        let batch = resp.into_inner().flushed.expect("a sentinel batch");
        sentinels.push(((key, "sentinel".to_owned()), batch.id));
    }
    sentinels
}

/// A key of `shard` under the tests' 4 shards.
fn sentinel_key(shard: u16) -> String {
    let keys = Keyspace::new("batcher", 4);
    (0..)
        .map(|n| format!("end-{n}"))
        .find(|key| keys.shard_of(key) == shard)
        .expect("a key on every shard")
}

/// The subscriber received every batch in the streams, and none twice.
#[track_caller]
fn assert_received_once(received: &Received, batches: &[batcher::batch::Batch]) {
    let ids = received.ids.lock().unwrap();
    let mut seen = HashSet::new();
    let twice: Vec<_> = ids.iter().filter(|id| !seen.insert(id.as_str())).collect();
    assert!(twice.is_empty(), "received twice: {twice:?}");
    let written: HashSet<String> = batches.iter().map(|b| b.id()).collect();
    let missed: Vec<_> = written
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .collect();
    assert!(missed.is_empty(), "never received: {missed:?}");
    let extra: Vec<_> = seen.iter().filter(|id| !written.contains(**id)).collect();
    assert!(
        extra.is_empty(),
        "received but not in the streams: {extra:?}"
    );
    assert!(
        received.resumed.load(Ordering::SeqCst) >= 2,
        "the subscriber never resumed"
    );
}
