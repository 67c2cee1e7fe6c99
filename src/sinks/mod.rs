//! Sinks: where the service itself delivers batches (`[[sinks]]` in the
//! config, docs/sinks.md). A sink is a durable consumer group
//! (`sink.<name>`) whose ack is the sink's acceptance: a batch is acked
//! only once the receiver took it, so a crash at any instant delivers it
//! again and never loses it; its dead letters and `Redrive` are the group's.
//!
//! - `deliverer`: one sink's deliverer on this instance: shard leases, the
//!   keys' lines (one batch in flight per key), retries and dead letters.
//! - `webhook`: the webhook kind: a signed POST and what its answer means.
//! - `secret`: signing secrets from a file or the environment, and the signature.
//! - `metrics`: deliveries per sink and outcome, keys waiting for a retry.
//!
//! A kind is the thing a deliverer hands a batch to and hears back from
//! ([`webhook::Attempt`]); the leases, lines, acks and dead letters are the
//! same for every kind.

mod deliverer;
pub mod secret;
pub mod webhook;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::Batch;
use crate::config::{SinkConfig, SinkOptions};
use crate::store::Store;
use deliverer::Deliverer;
use secret::Signer;
use webhook::Webhook;

/// This instance's consumer name in every sink's group, and the holder of
/// its leases: one per process, so a sink restarted by a reload keeps the
/// leases it had.
static CONSUMER: LazyLock<String> =
    LazyLock::new(|| format!("sink-{}-{:08x}", std::process::id(), fastrand::u32(..)));

/// How long a reload waits for a changed or removed sink's deliverer to stop.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The batch as a webhook body: the API's JSON mapping of `Batch`, with
/// `deliveryCount` the attempt.
pub fn body(batch: &Batch, attempt: u32) -> Arc<[u8]> {
    let message = crate::service::batch_to_pb(batch, String::new(), attempt);
    let json = crate::json::to_json(&message);
    serde_json::to_vec(&json)
        .expect("a JSON value serializes")
        .into()
}

/// A running sink: its config, its signer, and how to stop it.
struct Running {
    config: SinkConfig,
    signer: Signer,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

/// The sinks this instance delivers to, changed by [`Sinks::reload`].
#[derive(Clone)]
pub struct Sinks {
    store: Store,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// A tokio Mutex: a reload awaits the deliverers it stops while holding it.
    running: Arc<Mutex<HashMap<String, Running>>>,
}

impl Sinks {
    /// Starts a deliverer for each sink of `sinks` on `tracker`.
    pub async fn start(
        store: Store,
        sinks: &[SinkConfig],
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Sinks {
        let this = Sinks {
            store,
            tracker: tracker.clone(),
            shutdown,
            running: Arc::default(),
        };
        this.reload(sinks).await;
        this
    }

    /// Brings the running sinks in line with `sinks`: starts the new ones,
    /// restarts those whose config or secrets changed, stops the removed
    /// ones (their consumer groups and what they hold stay in Redis). A sink
    /// that cannot be set up (a secret or certificate file unreadable) is
    /// logged, and its running deliverer, if any, goes on.
    pub async fn reload(&self, sinks: &[SinkConfig]) {
        let mut running = self.running.lock().await;
        let wanted: HashMap<&str, &SinkConfig> =
            sinks.iter().map(|s| (s.name.as_str(), s)).collect();
        let gone: Vec<String> = running
            .keys()
            .filter(|name| !wanted.contains_key(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(old) = running.remove(&name) {
                stop(old).await;
                tracing::info!(sink = %name, "sink removed; its consumer group is kept");
            }
        }
        for sink in sinks {
            let SinkOptions::Webhook(options) = &sink.options;
            let webhook = Signer::of(options)
                .map_err(|(field, reason)| format!("options.{field}: {reason}"))
                .and_then(|signer| Webhook::new(options, signer).map_err(|err| err.to_string()));
            let webhook = match webhook {
                Ok(webhook) => webhook,
                Err(err) => {
                    tracing::error!(sink = %sink.name, %err, "sink cannot be set up; left as it was");
                    continue;
                }
            };
            if let Some(current) = running.get(&sink.name)
                && current.config == *sink
                && current.signer == *webhook.signer()
            {
                continue;
            }
            if let Some(old) = running.remove(&sink.name) {
                stop(old).await;
            }
            let signer = webhook.signer().clone();
            let stop = self.shutdown.child_token();
            let deliverer =
                Deliverer::new(self.store.clone(), sink.clone(), webhook, CONSUMER.clone());
            let done = self.tracker.spawn(deliverer.run(stop.clone()));
            tracing::info!(sink = %sink.name, kind = ?sink.kind(), "sink started");
            running.insert(
                sink.name.clone(),
                Running {
                    config: sink.clone(),
                    signer,
                    stop,
                    done,
                },
            );
        }
    }
}

/// Stops a sink's deliverer and waits for it (a bounded while).
async fn stop(running: Running) {
    running.stop.cancel();
    if tokio::time::timeout(STOP_WAIT, running.done).await.is_err() {
        tracing::warn!(sink = %running.config.name, "sink deliverer did not stop in time");
    }
}
