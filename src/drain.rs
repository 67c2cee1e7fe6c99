//! A stop is a drain. On the first SIGTERM (or SIGINT) the server (its
//! `run_draining`) goes through these steps, each logged
//! with its duration:
//!
//! 1. Readiness goes false at once: gRPC health reports NOT_SERVING and
//!    `GET /readyz` answers 503 (`/livez` stays 200), while every call is
//!    served as before for `drain_delay`, so that load balancers and
//!    readiness probes move traffic away.
//! 2. Then the listener closes and every connection gets an HTTP/2 GOAWAY;
//!    a call that still arrives is refused UNAVAILABLE; calls in flight are
//!    answered; live subscription streams end UNAVAILABLE (resume by
//!    cursor), durable ones too, once the batches their consumer held
//!    unacked have been released to the group's other consumers; the
//!    sweeper stops after its current pass. All of this within
//!    `drain_timeout`.
//!
//! A second signal, or `drain_timeout` running out, ends it at once.
//!
//! Here are the signals the server is given ([`Drain`]), the serving loop
//! that takes the steps in order and times them (`serve_until`), and the
//! health watcher that reports readiness to gRPC health and `/readyz`
//! (`Health`, [`Readiness`]). The steps' other parts live where their state
//! does: the refusal in `service::Deadlines`, the streams' last status in
//! the Subscribe handler, the release in `subscribers`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::Either;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::{Router, TcpIncoming};

use crate::store::Store;
use crate::tls::Tls;

/// How often the health service re-checks Redis.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How often it re-checks while Redis does not answer.
const HEALTH_RETRY: Duration = Duration::from_millis(100);

/// What a running server is told: when to begin draining, and when to stop
/// at once. Clones share their state.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    /// Cancelled when the drain begins.
    begin: CancellationToken,
    /// Cancelled when it must end at once.
    abort: CancellationToken,
    /// The delay before calls are refused; None: the config's `drain_delay`.
    delay: Option<Duration>,
}

impl Drain {
    /// A drain that waits the config's `drain_delay` before it refuses calls.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// A drain that begins when `shutdown` is cancelled, without the delay:
    /// the caller (an embedding program, a test) has decided when, and no
    /// load balancer is waiting for the health to change.
    pub fn on(shutdown: CancellationToken) -> Drain {
        Drain {
            begin: shutdown,
            abort: CancellationToken::new(),
            delay: Some(Duration::ZERO),
        }
    }

    /// Begins the drain (the first signal).
    pub fn begin(&self) {
        self.begin.cancel();
    }

    /// Ends the drain at once (a second signal).
    pub fn abort(&self) {
        self.abort.cancel();
    }

    /// Whether the drain has begun.
    pub fn has_begun(&self) -> bool {
        self.begin.is_cancelled()
    }

    /// Resolves when the drain begins.
    pub async fn begun(&self) {
        self.begin.cancelled().await
    }

    /// Resolves when the drain must end at once.
    pub async fn aborted(&self) {
        self.abort.cancelled().await
    }

    /// The delay before calls are refused, given the config's.
    pub fn delay(&self, configured: Duration) -> Duration {
        self.delay.unwrap_or(configured)
    }
}

/// Whether this instance should get traffic: Redis answers and no drain has
/// begun. gRPC health and `GET /readyz` both report it. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready, until the first look at Redis says otherwise.
    pub fn new() -> Readiness {
        Readiness::default()
    }

    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The gRPC server and where it listens.
pub(crate) struct Listening {
    pub router: Router,
    pub listener: TcpListener,
    /// `None`: plaintext.
    pub tls: Option<Tls>,
}

/// How long each step of the drain may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DrainTiming {
    /// From the drain's start until calls are refused.
    pub delay: Duration,
    /// From then until the server must be stopped.
    pub timeout: Duration,
}

/// Serves until `drain` is over: when it begins, serves on for the delay
/// (health reports NOT_SERVING meanwhile, see [`Health`]), then cancels
/// `closing`: the listener closes and every connection gets a GOAWAY, new
/// calls are refused, subscriptions end; it waits for the calls in flight,
/// at most the timeout. A second signal (`Drain::abort`) ends it at once.
/// Returns how the server ended and what is left of the timeout for the
/// background tasks.
pub(crate) async fn serve_until(
    listening: Listening,
    drain: &Drain,
    timing: DrainTiming,
    closing: &CancellationToken,
) -> (Result<(), tonic::transport::Error>, Duration) {
    let Listening {
        router,
        listener,
        tls,
    } = listening;
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), worker_threads, "serving");
    // tonic stops accepting and sends every connection a GOAWAY when the
    // signal resolves, then waits for the calls in flight.
    let stop = closing.clone().cancelled_owned();
    let server = match tls {
        Some(tls) => {
            Either::Left(router.serve_with_incoming_shutdown(tls.incoming(listener), stop))
        }
        // No Nagle: a small reply must not wait for the peer's delayed ACK.
        None => Either::Right(router.serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop,
        )),
    };
    let mut server = std::pin::pin!(server);
    tokio::select! {
        served = &mut server => return (served, timing.timeout),
        _ = drain.begun() => {}
    }
    let began = Instant::now();
    tracing::info!(
        drain_delay = ?timing.delay,
        "drain: health is NOT_SERVING; serving on for drain_delay"
    );
    tokio::select! {
        served = &mut server => return (served, timing.timeout),
        _ = tokio::time::sleep(timing.delay) => {}
        _ = drain.aborted() => {
            tracing::warn!(after = ?began.elapsed(), "drain: a second signal; stopping at once");
            closing.cancel();
            return (Ok(()), Duration::ZERO);
        }
    }
    closing.cancel();
    let refused = Instant::now();
    tracing::info!(
        not_ready_for = ?began.elapsed(),
        "drain: listener closed and GOAWAY sent; refusing new calls, ending subscriptions"
    );
    tokio::select! {
        served = &mut server => {
            tracing::info!(
                took = ?refused.elapsed(),
                "drain: every call answered and every stream ended"
            );
            (served, timing.timeout.saturating_sub(refused.elapsed()))
        }
        _ = tokio::time::sleep(timing.timeout) => {
            tracing::warn!(
                drain_timeout = ?timing.timeout,
                "drain: calls still open after drain_timeout; closing them"
            );
            (Ok(()), Duration::ZERO)
        }
        _ = drain.aborted() => {
            tracing::warn!(after = ?began.elapsed(), "drain: a second signal; stopping at once");
            (Ok(()), Duration::ZERO)
        }
    }
}

/// Cancels the background tasks and waits up to `left` (what the drain has
/// left of its timeout) for them to end: the sweeper's last pass, the tails,
/// the HTTP listener.
pub(crate) async fn stop_background(
    tasks: CancellationToken,
    tracker: TaskTracker,
    left: Duration,
) {
    let started = Instant::now();
    tasks.cancel();
    tracker.close();
    match tokio::time::timeout(left, tracker.wait()).await {
        Ok(()) => tracing::info!(
            took = ?started.elapsed(),
            "drain: background tasks stopped (the sweeper after its pass)"
        ),
        Err(_) => tracing::warn!(
            ?left,
            "drain: background tasks did not stop within what drain_timeout left; stopping anyway"
        ),
    }
}

/// What gRPC health and `GET /readyz` report, and what decides it.
pub(crate) struct Health {
    pub store: Store,
    pub readiness: Readiness,
    pub drain: Drain,
}

impl Health {
    /// Reports SERVING while Redis answers and NOT_SERVING while it does
    /// not, or not within `deadline` (a hung Redis). While it does not, it
    /// asks again every [`HEALTH_RETRY`], so SERVING returns soon after
    /// Redis does. From the drain's start it reports NOT_SERVING for good,
    /// while the service still serves.
    pub(crate) async fn watch(
        self,
        reporter: tonic_health::server::HealthReporter,
        deadline: Duration,
        shutdown: CancellationToken,
    ) {
        const SERVICE: &str = "batcher.v1.Batcher";
        let report = |status| {
            let reporter = reporter.clone();
            async move {
                reporter.set_service_status(SERVICE, status).await;
                reporter.set_service_status("", status).await;
            }
        };
        let mut serving = None;
        while !shutdown.is_cancelled() {
            let ok = tokio::select! {
                _ = self.drain.begun() => break,
                pinged = tokio::time::timeout(deadline, self.store.ping()) => matches!(pinged, Ok(Ok(()))),
            };
            if serving != Some(ok) && !self.drain.has_begun() {
                let status = if ok {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                report(status).await;
                self.readiness.set(ok);
                serving = Some(ok);
            }
            let pause = if ok { HEALTH_EVERY } else { HEALTH_RETRY };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.drain.begun() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        // The drain has begun (or the service stops): not ready any more.
        self.readiness.set(false);
        report(tonic_health::ServingStatus::NotServing).await;
    }
}
