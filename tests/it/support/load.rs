//! Load for fault tests: callers that add distinct items without pause and
//! retry each failed add until it is answered (or, as a crash leaves
//! callers, stop at their first failed add), recording what they were told
//! (acknowledged items, failures, the longest stretch without an answer),
//! and the exactly-once count of acknowledged items against the batches.
//! [`until_answered`] is the retry of one call, for tests with callers of
//! their own.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;

use batcher_testkit::Wait;

use super::{DEADLINE, add, eventually, placements};

/// An item: its key and id.
pub type ItemRef = (String, String);

/// How long one caller may go without an answer before it gives up.
pub const OUTAGE_LIMIT: Duration = Duration::from_secs(60);
/// Pause before retrying a failed add, so a down shard is not hammered.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// What the callers were told.
#[derive(Debug, Default)]
pub struct Tally {
    /// Items answered ADDED, or DUPLICATE after a failed try (so applied).
    pub acknowledged: HashSet<ItemRef>,
    /// Failed calls that were UNAVAILABLE.
    pub unavailable: usize,
    /// Failed calls with another code: there should be none.
    pub other_errors: Vec<String>,
    /// The longest time one caller went from a failure to an answer.
    pub longest_outage: Duration,
    /// The longest time one failed call took to fail.
    pub slowest_failure: Duration,
    /// Callers that gave up after [`OUTAGE_LIMIT`] without an answer.
    pub gave_up: usize,
    /// The adds at which the callers of [`Load::until_failure`] stopped:
    /// each got no answer, so the test retries it.
    pub unanswered: Vec<ItemRef>,
}

/// What a caller does when an add fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnFailure {
    /// Retries it until answered (giving up after [`OUTAGE_LIMIT`]).
    Retry,
    /// Stops, leaving the add in [`Tally::unanswered`].
    Stop,
}

/// Callers adding under load; see the module docs.
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Adds answered.
    answered: Arc<AtomicUsize>,
    /// Calls that returned, answered or failed.
    calls: Arc<AtomicUsize>,
    tally: Arc<Mutex<Tally>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts one caller per client, spreading adds over `keys` keys.
    pub fn start(clients: Vec<BatcherClient<Channel>>, keys: usize) -> Load {
        Load::with(clients, keys, OnFailure::Retry)
    }

    /// [`Load::start`], with callers that stop at their first failed add,
    /// as a crash of the service or of Redis leaves them.
    pub fn until_failure(clients: Vec<BatcherClient<Channel>>, keys: usize) -> Load {
        Load::with(clients, keys, OnFailure::Stop)
    }

    fn with(clients: Vec<BatcherClient<Channel>>, keys: usize, on_failure: OnFailure) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(task, client)| {
                let caller = Caller {
                    client,
                    task,
                    keys,
                    on_failure,
                    stop: stop.clone(),
                    answered: answered.clone(),
                    calls: calls.clone(),
                    tally: tally.clone(),
                };
                tokio::spawn(caller.run())
            })
            .collect();
        Load {
            stop,
            answered,
            calls,
            tally,
            tasks,
        }
    }

    /// Waits until `more` further adds have been answered.
    pub async fn wait_answered(&self, more: usize) {
        wait_count(&self.answered, more, "answered adds").await;
    }

    /// Waits until `more` further calls have returned, answered or failed.
    pub async fn wait_calls(&self, more: usize) {
        wait_count(&self.calls, more, "calls").await;
    }

    /// Stops the callers (each first gets its current add answered) and
    /// returns what they were told.
    pub async fn finish(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            tokio::time::timeout(OUTAGE_LIMIT + DEADLINE, task)
                .await
                .expect("a caller did not stop")
                .expect("a caller panicked");
        }
        std::mem::take(&mut *self.tally.lock().unwrap())
    }
}

/// Waits until `counter` has grown by `more`.
async fn wait_count(counter: &AtomicUsize, more: usize, what: &str) {
    let target = counter.load(Ordering::SeqCst) + more;
    eventually(&format!("{more} more {what}"), || {
        let done = counter.load(Ordering::SeqCst) >= target;
        async move { done.then_some(()) }
    })
    .await;
}

/// One caller of a [`Load`].
struct Caller {
    client: BatcherClient<Channel>,
    task: usize,
    keys: usize,
    on_failure: OnFailure,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    tally: Arc<Mutex<Tally>>,
}

impl Caller {
    /// Adds `t<task>-<i>` under `zone-<i % keys>` until told to stop.
    async fn run(mut self) {
        for i in 0.. {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let key = format!("zone-{}", i % self.keys);
            let id = format!("t{}-{i}", self.task);
            if !self.add_until_answered(&key, &id).await {
                return;
            }
        }
    }

    /// Adds one item, retrying failures; false if it gave up or stopped.
    async fn add_until_answered(&mut self, key: &str, id: &str) -> bool {
        let mut failing_since: Option<Instant> = None;
        loop {
            let call = self.client.add(add(key, id, b"payload"));
            let sent = Instant::now();
            let reply = tokio::time::timeout(DEADLINE, call).await;
            let reply = reply.unwrap_or_else(|_| panic!("add {key}/{id} hung"));
            if reply.is_err() {
                let mut tally = self.tally.lock().unwrap();
                tally.slowest_failure = tally.slowest_failure.max(sent.elapsed());
            }
            if let Some(answered) = self.record(reply, (key, id), failing_since) {
                return answered;
            }
            if self.on_failure == OnFailure::Stop {
                let item = (key.to_string(), id.to_string());
                self.tally.lock().unwrap().unanswered.push(item);
                return false;
            }
            failing_since.get_or_insert_with(Instant::now);
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Records one reply; `Some(answered)` once the item needs no retry.
    fn record(
        &self,
        reply: Result<tonic::Response<pb::AddResponse>, tonic::Status>,
        (key, id): (&str, &str),
        failing_since: Option<Instant>,
    ) -> Option<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut tally = self.tally.lock().unwrap();
        match reply {
            Ok(resp) => {
                let added = resp.into_inner().outcome == pb::AddOutcome::Added as i32;
                // DUPLICATE after a failed try: that try was applied.
                if added || failing_since.is_some() {
                    tally.acknowledged.insert((key.into(), id.into()));
                }
                if let Some(since) = failing_since {
                    tally.longest_outage = tally.longest_outage.max(since.elapsed());
                }
                self.answered.fetch_add(1, Ordering::SeqCst);
                return Some(true);
            }
            Err(status) if status.code() == tonic::Code::Unavailable => tally.unavailable += 1,
            Err(status) => tally.other_errors.push(format!("{key}/{id}: {status:?}")),
        }
        if failing_since.is_some_and(|since| since.elapsed() > OUTAGE_LIMIT) {
            tally.gave_up += 1;
            return Some(false);
        }
        None
    }
}

/// Sends `call` until it is answered, retrying UNAVAILABLE (a Redis reply
/// slower than the service's response timeout, under load) after a pause
/// of [`RETRY_PAUSE`], for up to [`DEADLINE`]; any other error fails the
/// test. Returns the answer, and whether a try failed first: Redis may have
/// applied that try, and then the answer is DUPLICATE.
pub async fn until_answered<T, F, Fut>(what: &str, mut call: F) -> (T, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let failed = AtomicBool::new(false);
    let wait = Wait::new(format!("{what} to be answered"), DEADLINE).every(RETRY_PAUSE);
    let answer = wait
        .until_ok(|| {
            let reply = call();
            let failed = &failed;
            async move {
                let status = match reply.await {
                    Ok(reply) => return Ok(reply.into_inner()),
                    Err(status) => status,
                };
                assert_eq!(
                    status.code(),
                    tonic::Code::Unavailable,
                    "{what}: {status:?}"
                );
                failed.store(true, Ordering::SeqCst);
                Err(status.message().to_owned())
            }
        })
        .await;
    (
        answer.unwrap_or_else(|e| panic!("{e}")),
        failed.load(Ordering::SeqCst),
    )
}

/// Acknowledged items against the batches they should be in.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Acknowledged items.
    pub acknowledged: usize,
    /// Acknowledged items in no batch.
    pub lost: usize,
    /// Items in more than one batch.
    pub duplicated: usize,
    /// Items in a batch that no caller ever tried to add.
    pub unknown: usize,
}

/// Counts, for items the callers tried (all acknowledged in the end, unless
/// a caller gave up), how many are lost, doubled or unknown in `batches`.
pub fn placement(tally: &Tally, batches: &[batcher::batch::Batch]) -> Placement {
    let placed = placements(batches);
    Placement {
        acknowledged: tally.acknowledged.len(),
        lost: (tally.acknowledged.iter())
            .filter(|item| !placed.contains_key(*item))
            .count(),
        duplicated: placed.values().filter(|n| **n > 1).count(),
        unknown: (placed.keys())
            .filter(|item| !tally.acknowledged.contains(*item))
            .count(),
    }
}
