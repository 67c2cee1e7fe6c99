//! A network partition between the service and Redis, under load, made by
//! the fault proxy (`support::proxy`): 5 s with nothing moving, then 4 s of
//! added latency, then a clean link. What it checks is what docs/api.md and
//! docs/operations.md (Overload, "One deadline per call") promise: calls
//! fail UNAVAILABLE within their deadline, health reports NOT_SERVING while
//! Redis does not answer and SERVING once it does, and adds stay exactly
//! once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::load::{ItemRef, Placement, Tally, placement};
use crate::support::proxy::{Fault, Proxy};
use crate::support::{
    DEADLINE, RedisServer, add, all_batches, channel, config, config_text, eventually,
    process_with, store, wait_health,
};
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// `[redis] response_timeout` of the service under test (the default).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Groups of up to 10 items, flushed 300 ms after they open.
const SETTINGS: &str = "[defaults]\nmax_items = 10\nmax_wait = \"300ms\"\n\
                        [sweeper]\nmax_sleep = \"100ms\"\n";
/// Appended to the `[redis]` table: `RESPONSE_TIMEOUT`, and a short
/// connect timeout.
const REDIS_TIMEOUTS: &str = "connect_timeout = \"500ms\"\nresponse_timeout = \"2s\"\n";
/// How long nothing moves.
const CUT: Duration = Duration::from_secs(5);
/// How long the link is slow after the cut.
const SLOW: Duration = Duration::from_secs(4);
/// The latency the slow link adds, each way.
const LATENCY: Duration = Duration::from_millis(50);
/// The service's health loop pings Redis once a second and gives each ping
/// the response timeout, so NOT_SERVING may show up to a second after the
/// response timeout has run out; the rest is room for a busy machine.
const HEALTH_MARGIN: Duration = Duration::from_millis(1500);
/// Within this of the heal, health reports SERVING again: while Redis does
/// not answer, the health loop pings it every 100 ms (`HEALTH_RETRY` in
/// src/server.rs).
const BACK_WITHIN: Duration = Duration::from_secs(1);
/// Callers adding at once, and the keys they spread their adds over.
const CALLERS: usize = 6;
const KEYS: usize = 8;
/// The deadline of every add: longer than the response timeout, which then
/// bounds the call. (A shorter one, which the service answers a tenth early
/// so the client hears why, is deadlines.rs's; under a machine loaded many
/// times over, those 200 ms can run out and the client hears CANCELLED.)
const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// How much later than its budget a failed call may return, for
/// scheduling on a busy machine. A call this late past its deadline counts
/// as hung.
const SLACK: Duration = Duration::from_millis(500);

/// One add call as its caller saw it.
#[derive(Debug)]
struct Call {
    sent: Instant,
    took: Duration,
    deadline: Duration,
    /// Whether an earlier call for the same item failed.
    retry: bool,
    /// The outcome, or the code and ErrorInfo reason of the failure; None
    /// when the call hung past its deadline and the slack.
    answer: Option<Result<i32, (Code, String)>>,
}

impl Call {
    /// The most the service may take (docs/operations.md, "One deadline per
    /// call"): the response timeout, or the deadline less a tenth of it (at
    /// most 200 ms) when that is shorter.
    fn budget(&self) -> Duration {
        let early = (self.deadline / 10).min(Duration::from_millis(200));
        RESPONSE_TIMEOUT.min(self.deadline - early)
    }
}

/// What the callers did, shared with the test.
#[derive(Default)]
struct Record {
    calls: Mutex<Vec<Call>>,
    /// Items whose add was answered.
    answered: Mutex<HashSet<ItemRef>>,
    count: AtomicUsize,
    stop: AtomicBool,
}

/// Callers that add distinct items without pause through one instance,
/// repeating each add until it is answered, with a deadline on every call.
struct Callers {
    record: Arc<Record>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Callers {
    fn start(client: BatcherClient<tonic::transport::Channel>) -> Callers {
        let record = Arc::new(Record::default());
        let tasks = (0..CALLERS)
            .map(|task| tokio::spawn(caller(client.clone(), task, record.clone())))
            .collect();
        Callers { record, tasks }
    }

    /// Waits until `more` further adds have been answered.
    async fn wait_answered(&self, more: usize) {
        let target = self.record.count.load(Ordering::SeqCst) + more;
        eventually(&format!("{more} more answered adds"), || {
            let done = self.record.count.load(Ordering::SeqCst) >= target;
            async move { done.then_some(()) }
        })
        .await;
    }

    /// Stops the callers once their current item is answered.
    async fn finish(self) -> Arc<Record> {
        self.record.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("a caller did not stop")
                .expect("a caller panicked");
        }
        self.record
    }
}

/// One caller: `p<task>-<i>` under `zone-<i % KEYS>`, each until answered.
async fn caller(
    client: BatcherClient<tonic::transport::Channel>,
    task: usize,
    record: Arc<Record>,
) {
    for i in 0.. {
        if record.stop.load(Ordering::SeqCst) {
            return;
        }
        let item = (format!("zone-{}", i % KEYS), format!("p{task}-{i}"));
        let mut retry = false;
        loop {
            let call = timed_add(client.clone(), &item, CALL_DEADLINE, retry).await;
            let answered = matches!(call.answer, Some(Ok(_)));
            record.calls.lock().unwrap().push(call);
            if answered {
                record.answered.lock().unwrap().insert(item);
                record.count.fetch_add(1, Ordering::SeqCst);
                break;
            }
            retry = true;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One add with `deadline` as its grpc-timeout, timed.
async fn timed_add(
    mut client: BatcherClient<tonic::transport::Channel>,
    (key, id): &ItemRef,
    deadline: Duration,
    retry: bool,
) -> Call {
    let mut request = tonic::Request::new(add(key, id, b"payload"));
    request.set_timeout(deadline);
    let sent = Instant::now();
    let reply = tokio::time::timeout(deadline + SLACK, client.add(request)).await;
    let answer = reply.ok().map(|reply| match reply {
        Ok(resp) => Ok(resp.into_inner().outcome),
        Err(status) => Err((status.code(), reason(&status))),
    });
    Call {
        sent,
        took: sent.elapsed(),
        deadline,
        retry,
        answer,
    }
}

/// The ErrorInfo reason of `status`, or "" if it has none.
fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// What a [`HealthWatch`] saw: each change of status with when it was
/// seen, and the checks slower than `SLOW_CHECK`, with when they were sent.
#[derive(Default)]
struct Health {
    changes: Vec<(Instant, i32)>,
    slow_checks: Vec<(Instant, Duration)>,
}

/// A health check this slow is reported; one that takes `HUNG_CHECK` fails
/// the test (the service answers checks from memory, Redis or not).
const SLOW_CHECK: Duration = Duration::from_millis(250);
const HUNG_CHECK: Duration = Duration::from_secs(3);

/// Polls health every 50 ms until stopped.
struct HealthWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Health>,
}

impl HealthWatch {
    fn start(addr: std::net::SocketAddr) -> HealthWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut client = HealthClient::new(channel(addr));
            let mut health = Health::default();
            while !stopped.load(Ordering::SeqCst) {
                let service = "batcher.v1.Batcher".to_owned();
                let sent = Instant::now();
                let check = client.check(HealthCheckRequest { service });
                let status = tokio::time::timeout(HUNG_CHECK, check).await;
                let status = status.expect("a health check hung").expect("health check");
                if sent.elapsed() > SLOW_CHECK {
                    health.slow_checks.push((sent, sent.elapsed()));
                }
                let status = status.into_inner().status;
                if health
                    .changes
                    .last()
                    .is_none_or(|(_, last)| *last != status)
                {
                    health.changes.push((Instant::now(), status));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            health
        });
        HealthWatch { stop, task }
    }

    async fn finish(self) -> Health {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the health watch panicked")
    }
}

/// When the faults began and ended.
struct Timeline {
    cut: Instant,
    healed: Instant,
    clean: Instant,
}

/// A cut of `CUT`, then `SLOW` of latency, then a clean link.
async fn partition(proxy: &Proxy) -> Timeline {
    let cut = Instant::now();
    proxy.set(Fault::Stall);
    tokio::time::sleep(CUT).await;
    let healed = Instant::now();
    proxy.set(Fault::Slow(LATENCY));
    tokio::time::sleep(SLOW).await;
    let clean = Instant::now();
    proxy.set(Fault::Pass);
    Timeline { cut, healed, clean }
}

/// Five seconds of nothing moving between the service and Redis, then four
/// of added latency, under load: health goes NOT_SERVING within the response
/// timeout plus a margin and is back within its one-second period (plus a
/// margin) of the heal, every call returns within its deadline, those that
/// could not reach Redis fail UNAVAILABLE and those after the heal succeed,
/// and no add is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_fails_fast_and_heals() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(([127, 0, 0, 1], redis.port()).into()).await;
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&proxy.url(), SETTINGS) + REDIS_TIMEOUTS;
    let service = process_with(dir.path(), &text).await;
    wait_health(service.addr, ServingStatus::Serving).await;
    let health = HealthWatch::start(service.addr);
    let client = crate::support::client(service.addr).await;
    let callers = Callers::start(client.clone());
    callers.wait_answered(200).await;

    let timeline = partition(&proxy).await;
    callers.wait_answered(200).await;
    let record = callers.finish().await;
    let health = health.finish().await;
    let placed = settle(&client, &redis, &record).await;

    let calls = std::mem::take(&mut *record.calls.lock().unwrap());
    report(&calls, &health, &timeline, &placed);
    assert_health(&health.changes, &timeline);
    assert_calls(&calls, &timeline);
    let clean = Placement {
        acknowledged: placed.acknowledged,
        ..Placement::default()
    };
    assert_eq!(placed, clean, "every answered add in exactly one batch");
    service.stop().await;
}

/// Flushes every key, waits until no group is open, and counts the answered
/// items against every batch in Redis.
async fn settle(
    client: &BatcherClient<tonic::transport::Channel>,
    redis: &RedisServer,
    record: &Record,
) -> Placement {
    for key in 0..KEYS {
        let flush = pb::FlushRequest {
            key: format!("zone-{key}"),
        };
        client.clone().flush(flush).await.expect("flush");
    }
    crate::support::cluster::wait_all_flushed(client).await;
    let batches = all_batches(&store(&config(&redis.url(), ""))).await;
    let tally = Tally {
        acknowledged: record.answered.lock().unwrap().clone(),
        ..Tally::default()
    };
    placement(&tally, &batches)
}

/// Health: SERVING until the cut, NOT_SERVING within the response timeout
/// and the margin, SERVING again within a second of the heal and from then on.
#[track_caller]
fn assert_health(changes: &[(Instant, i32)], at: &Timeline) {
    let serving = ServingStatus::Serving as i32;
    let before: Vec<_> = changes.iter().filter(|(t, _)| *t < at.cut).collect();
    assert!(before.iter().all(|(_, s)| *s == serving), "{changes:?}");
    let down = changes.iter().find(|(t, s)| *t >= at.cut && *s != serving);
    let (down, status) = down.expect("health never left SERVING during the cut");
    assert_eq!(*status, ServingStatus::NotServing as i32);
    let took = *down - at.cut;
    assert!(
        took <= RESPONSE_TIMEOUT + HEALTH_MARGIN,
        "NOT_SERVING {took:?} after the cut"
    );
    let after: Vec<_> = changes.iter().filter(|(t, _)| t > down).collect();
    let (back, status) = after.first().expect("health never came back");
    assert_eq!(*status, serving);
    let took = back.saturating_duration_since(at.healed);
    assert!(took <= BACK_WITHIN, "SERVING {took:?} after the heal");
    assert_eq!(
        after.len(),
        1,
        "health changed again after the heal: {changes:?}"
    );
}

/// Calls: every one returned within its budget (or failed at most `SLACK`
/// past it) with an answer or UNAVAILABLE; every call that began and ran out
/// within the cut failed; every call sent after the heal succeeded; every
/// first try was answered ADDED.
#[track_caller]
fn assert_calls(calls: &[Call], at: &Timeline) {
    for call in calls {
        match &call.answer {
            None => panic!("a call hung past its deadline: {call:?}"),
            Some(Ok(outcome)) if !call.retry => {
                assert_eq!(*outcome, pb::AddOutcome::Added as i32, "{call:?}")
            }
            Some(Ok(_)) => {}
            Some(Err((code, _))) => {
                assert_eq!(*code, Code::Unavailable, "{call:?}");
                assert!(call.took <= call.budget() + SLACK, "{call:?}");
            }
        }
    }
    let cut: Vec<_> = (calls.iter())
        .filter(|c| c.sent >= at.cut && c.sent + c.budget() <= at.healed)
        .collect();
    assert!(cut.len() >= CALLERS, "only {} calls in the cut", cut.len());
    let answered: Vec<_> = (cut.iter())
        .filter(|c| !matches!(c.answer, Some(Err(_))))
        .collect();
    assert!(answered.is_empty(), "answered during the cut: {answered:?}");
    let failed: Vec<_> = (calls.iter())
        .filter(|c| c.sent >= at.healed && !matches!(c.answer, Some(Ok(_))))
        .collect();
    assert!(failed.is_empty(), "failed after the heal: {failed:?}");
}

/// Prints what happened, for the test log.
fn report(calls: &[Call], health: &Health, at: &Timeline, placed: &Placement) {
    // Milliseconds since the cut, negative before it.
    let since = |t: Instant| match t.checked_duration_since(at.cut) {
        Some(after) => after.as_millis() as i64,
        None => -(at.cut.duration_since(t).as_millis() as i64),
    };
    let changes: Vec<_> = (health.changes.iter())
        .map(|(t, s)| (since(*t), *s))
        .collect();
    let slow_checks: Vec<_> = (health.slow_checks.iter())
        .map(|(t, d)| (since(*t), *d))
        .collect();
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| !matches!(c.answer, Some(Ok(_))))
        .collect();
    let reasons: HashSet<_> = (failed.iter())
        .filter_map(|c| c.answer.as_ref()?.as_ref().err().map(|(_, r)| r.clone()))
        .collect();
    let slowest = failed.iter().map(|c| c.took.as_millis()).max();
    // Items whose add failed, landed all the same, and whose retry was told DUPLICATE.
    let landed = (calls.iter())
        .filter(|c| {
            c.retry && matches!(c.answer, Some(Ok(o)) if o == pb::AddOutcome::Duplicate as i32)
        })
        .count();
    let slow_ok = (calls.iter())
        .filter(|c| c.sent >= at.healed && c.sent < at.clean)
        .map(|c| c.took.as_millis())
        .max();
    eprintln!(
        "partition: {} calls, {} failed (reasons {reasons:?}, slowest failure {slowest:?} ms); \
         {landed} retries answered DUPLICATE; slowest call in the slow phase {slow_ok:?} ms; \
         health (ms since the cut, status) {changes:?}, slow checks {slow_checks:?}; heal at {} ms; \
         {placed:?}",
        calls.len(),
        failed.len(),
        since(at.healed),
    );
}
