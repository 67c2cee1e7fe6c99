//! Wires the parts together and serves gRPC (and the HTTP listener) until shutdown.

use std::path::PathBuf;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::Router;

use crate::auth::{self, Auth};
use crate::config::{Config, ConfigError};
use crate::drain::{
    Drain, DrainTiming, Health, Listening, Readiness, serve_until, stop_background,
};
use crate::embedded::{EmbeddedError, EmbeddedOptions, EmbeddedRedis};
use crate::keys::Keyspace;
use crate::pb::batcher_server::BatcherServer;
use crate::policy::PolicyHandle;
use crate::policy_store::PolicyStore;
use crate::service::{BatcherService, Deadlines};
use crate::store::{Endpoint, Password, RedisTarget, Store, StoreError, Timeouts, WaitReplicas};
use crate::subscribers::Hub;
use crate::tls::{self, Tls, TlsError};
use crate::{gauges, metrics, pb, sweeper};

/// The tokio runtime the service runs on: `worker_threads` workers
/// (`Config::worker_threads`: one for a single Redis, one per core for a
/// cluster, unless the config says), with I/O and timers, and without the
/// worker's LIFO slot when built with `--cfg tokio_unstable` (as
/// `.cargo/config.toml` builds it).
///
/// One worker runs a request, the shard writer it wakes and the connection
/// that answers it on one thread, so no wake-up crosses threads: in scenario
/// 2 (unary Add, 64 callers) the service spent about a third less CPU per
/// add with one worker than with two. More workers deliver a batch to many
/// subscribers sooner, in parallel (docs/operations.md#threads).
///
/// The LIFO slot runs a task that another task woke right after the waker,
/// ahead of every task already queued. When an add round's replies wake the
/// waiting requests, each request then wakes its HTTP/2 connection, which
/// would run at once and write that one response. Without the slot, the
/// connection runs after the other requests the round woke and writes their
/// responses together: in scenario 2 (unary Add, 64 callers) the service
/// spent about a quarter less CPU per add (docs/internals.md).
pub fn runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(worker_threads).enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// `[redis] tls_ca_file` cannot be read, or holds no PEM certificate.
    #[error("[redis] tls_ca_file {}: {reason}", path.display())]
    TlsCa { path: PathBuf, reason: String },
    /// `[redis] password_file` cannot be read.
    #[error("[redis] password_file {}: {reason}", path.display())]
    PasswordFile { path: PathBuf, reason: String },
    /// A `[tls]` file is missing or bad.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// The guard rails at the edge of the gRPC port, shared by the server and
/// the SIGHUP reloader.
#[derive(Clone)]
struct Edge {
    /// `None`: the port is plaintext.
    tls: Option<Tls>,
    auth: Auth,
}

/// Serves the batcher API on `listener` until `shutdown` is cancelled, and
/// `GET /metrics` and the web view on `http` (the listener of `[http]`,
/// which the caller binds, as with `crate::http::bind`; None serves no HTTP).
/// The cancellation drains the service without `drain_delay` (see
/// [`run_draining`]).
///
/// With no Redis URL in `config`, it first starts its own `redis-server`
/// (see `embedded`) and stops it on the way out. `reload_from` names the
/// config file that SIGHUP re-reads; a bad file is logged and ignored.
pub async fn run(
    listener: TcpListener,
    http: Option<TcpListener>,
    config: Config,
    reload_from: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    run_draining(listener, http, config, reload_from, Drain::on(shutdown)).await
}

/// [`run`], until `drain` has been gone through (see `crate::drain`): the
/// binary begins it on the first SIGTERM or SIGINT and aborts it on a second.
pub async fn run_draining(
    listener: TcpListener,
    http: Option<TcpListener>,
    config: Config,
    reload_from: Option<PathBuf>,
    drain: Drain,
) -> Result<(), ServerError> {
    // A bad [tls] file stops the start before anything else is started.
    let edge = Edge {
        tls: config.tls.as_ref().map(Tls::load).transpose()?,
        auth: Auth::new(config.auth.as_ref()),
    };
    if let Ok(addr) = listener.local_addr() {
        auth::warn_if_open(&edge.auth, edge.tls.is_some(), addr);
    }
    let embedded = match (&config.redis.url, config.redis.cluster_nodes.is_empty()) {
        (None, true) => Some(
            EmbeddedRedis::start(EmbeddedOptions {
                redis_server: config.redis.redis_server.clone(),
                data_dir: config.redis.data_dir.clone(),
                appendfsync: config.redis.appendfsync,
            })
            .await?,
        ),
        _ => None,
    };
    let endpoint = match (&config.redis.url, &embedded) {
        (Some(url), _) => Endpoint::Single(url.clone()),
        (None, Some(embedded)) => Endpoint::Single(embedded.url().to_owned()),
        (None, None) => Endpoint::Cluster(config.redis.cluster_nodes.clone()),
    };
    let result = serve(listener, http, &config, endpoint, edge, reload_from, drain).await;
    if let Some(embedded) = embedded {
        embedded.stop().await;
    }
    result
}

/// Serves with Redis at `endpoint`: starts the background tasks, serves gRPC
/// (and HTTP) until `drain` is over, then stops the background tasks.
async fn serve(
    listener: TcpListener,
    http: Option<TcpListener>,
    config: &Config,
    endpoint: Endpoint,
    edge: Edge,
    reload_from: Option<PathBuf>,
    drain: Drain,
) -> Result<(), ServerError> {
    let store = open_store(config, endpoint).await?;
    // The drain's second step: calls are refused, subscriptions end and the
    // sweeper stops after its pass.
    let closing = CancellationToken::new();
    // The other background tasks stop on `tasks`, cancelled once the gRPC
    // server has answered every call (or the drain was cut short).
    let tasks = CancellationToken::new();
    let tracker = TaskTracker::new();
    let readiness = Readiness::new();
    let started = StartedTasks {
        tracker: &tracker,
        tasks: &tasks,
        closing: &closing,
    };
    // Sinks stop when the drain refuses calls: their leases are given up,
    // so other instances take their shards over at once.
    let sinks =
        crate::sinks::Sinks::start(store.clone(), &config.sinks, &tracker, closing.clone()).await;
    let service = start_service(store.clone(), config, reload_from, &edge, sinks, &started);
    let web_api = crate::http::Api {
        service: service.clone(),
        auth: edge.auth.clone(),
        deadline: config.redis.response_timeout,
        shutdown: tasks.clone(),
        readiness: readiness.clone(),
    };
    let health = Health {
        store: store.clone(),
        readiness,
        drain: drain.clone(),
    };
    let router = routes(service, health, &edge.auth, config, &started)?;
    if let Some(http) = http {
        let routes = crate::http::routes(web_api);
        tracker.spawn(crate::http::serve(http, routes, tasks.clone()));
        tracker.spawn(gauges::refresh(store, tasks.clone()));
    }
    let timing = DrainTiming {
        delay: drain.delay(config.drain_delay),
        timeout: config.drain_timeout,
    };
    let listening = Listening {
        router,
        listener,
        tls: edge.tls,
    };
    let (served, left) = serve_until(listening, &drain, timing, &closing).await;
    stop_background(tasks, tracker, left).await;
    served?;
    Ok(())
}

/// The tokens and tracker the background tasks are started with.
struct StartedTasks<'a> {
    tracker: &'a TaskTracker,
    /// Ends them after the gRPC server.
    tasks: &'a CancellationToken,
    /// Ends the sweeper and the subscriptions when the drain refuses calls.
    closing: &'a CancellationToken,
}

/// Opens the store at `endpoint`. Redis need not answer yet: until it does,
/// the API answers UNAVAILABLE. Wrong credentials do not stop the start
/// either (they may be fixed on the Redis side): they are logged, and calls
/// fail INTERNAL with "authentication failed" until they are.
async fn open_store(config: &Config, endpoint: Endpoint) -> Result<Store, ServerError> {
    let r = &config.redis;
    let target = RedisTarget {
        endpoint,
        timeouts: Timeouts {
            connect: r.connect_timeout,
            response: r.response_timeout,
        },
        wait: (r.wait_replicas > 0).then_some(WaitReplicas {
            replicas: r.wait_replicas,
            timeout: r.wait_timeout,
        }),
        tls_ca: match &r.tls_ca_file {
            Some(path) => Some(read_tls_ca(path).map_err(|reason| ServerError::TlsCa {
                path: path.clone(),
                reason,
            })?),
            None => None,
        },
        password: match &r.password_file {
            Some(path) => Some(read_password(path).map_err(|reason| {
                let path = path.clone();
                ServerError::PasswordFile { path, reason }
            })?),
            None => None,
        },
    };
    let keyspace = Keyspace::new(&r.prefix, r.shards.get());
    let store = Store::open(
        &target,
        keyspace,
        config.dedup.window,
        PolicyHandle::new(config.policies()),
    )?
    .with_max_queued_adds(config.limits.max_queued_adds);
    store.set_max_open_groups(config.limits.max_open_groups);
    let pinged = match store.ping().await {
        // A cluster client hides why it could not connect behind "no
        // connections found"; a connection of its own says why.
        Err(_) if matches!(target.endpoint, Endpoint::Cluster(_)) => {
            store.blocking_connection().await.map(drop)
        }
        pinged => pinged,
    };
    match pinged {
        // A Redis that answers must hold our data format, or nothing is
        // served. A read that fails for want of an answer (a busy Redis)
        // leaves the check to the first write, as when Redis is down.
        Ok(()) => match store.check_format().await {
            Err(err @ (StoreError::WrongFormat { .. } | StoreError::WrongShards { .. })) => {
                return Err(err.into());
            }
            Err(err) => tracing::warn!(
                %err,
                "cannot read the data format marker yet; checking it before the first write"
            ),
            Ok(()) => {}
        },
        Err(err) if is_auth_failure(&err) => tracing::warn!(
            %err,
            "redis authentication failed: check the user and password in [redis] url or \
             cluster_nodes; calls fail until Redis accepts them"
        ),
        Err(err) => {
            tracing::warn!(%err, "redis is not reachable yet; serving UNAVAILABLE until it is")
        }
    }
    Ok(store)
}

/// Whether Redis refused the credentials (a wrong password or user), or
/// asked for some that the URL does not give. A cluster client reports it
/// inside an I/O error, in redis-rs's words ("authentication failed").
fn is_auth_failure(err: &StoreError) -> bool {
    let (StoreError::Redis(err) | StoreError::Unavailable(err)) = err else {
        return false;
    };
    err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("NOAUTH" | "WRONGPASS"))
        || err.to_string().contains("authentication failed")
}

/// The PEM root certificates in `path`, or why it cannot serve as
/// `tls_ca_file` (unreadable, or holding no PEM certificate).
fn read_tls_ca(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let pem = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(pem)
}

/// The password in `path`, without one trailing newline.
fn read_password(path: &std::path::Path) -> Result<Password, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot be read: {e}"))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    match text.is_empty() {
        true => Err("is empty".to_owned()),
        false => Ok(Password::new(text)),
    }
}

/// Starts the sweeper, the subscription hub and (with a config file) the
/// SIGHUP reloader on `tracker`, and returns the API service that uses them.
fn start_service(
    store: Store,
    config: &Config,
    reload_from: Option<PathBuf>,
    edge: &Edge,
    sinks: crate::sinks::Sinks,
    started: &StartedTasks<'_>,
) -> BatcherService {
    let (tracker, tasks) = (started.tracker, started.tasks);
    let policies = store.policies().clone();
    // The sweeper stops after its pass when the drain refuses calls: an
    // instance that is going away leaves the due groups to the others.
    let sweeper = sweeper::spawn(
        store.clone(),
        config.sweeper,
        config.subscriptions.retention,
        config.subscriptions.trim_every,
        tracker,
        started.closing.clone(),
    );
    let hub = Hub::start(
        store.clone(),
        config.subscriptions.buffer.get(),
        tracker,
        started.closing.clone(),
    );
    // With the policy store on, the file's tables only seed an empty store,
    // and SIGHUP leaves the policies alone.
    let policy_store = config.policy_store.enabled.then(|| {
        let seeder = match &reload_from {
            Some(path) => format!("config file {}", path.display()),
            None => "config file".to_owned(),
        };
        let ps = PolicyStore::new(store.clone(), config, policies.clone(), &seeder);
        let every = config.policy_store.check_every;
        tracker.spawn(ps.clone().run(every, tasks.clone()));
        ps
    });
    if let Some(path) = reload_from {
        let file_policies = policy_store.is_none().then(|| policies.clone());
        let reload = reload_on_sighup(path, file_policies, edge.clone(), sinks, tasks.clone());
        tracker.spawn(reload);
    }
    let service = BatcherService::new(
        store,
        policies,
        config.limits,
        config.subscriptions,
        sweeper,
        hub,
    );
    match policy_store {
        Some(ps) => service.with_policy_store(ps),
        None => service,
    }
}

/// The gRPC routes: health (kept up to date by a task on `tracker`), server
/// reflection, and the batcher API, which alone needs a token, with one
/// deadline per call and the request size limit, refused once the drain
/// closes.
fn routes(
    service: BatcherService,
    health: Health,
    auth: &Auth,
    config: &Config,
    started: &StartedTasks<'_>,
) -> Result<Router, tonic_reflection::server::Error> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let deadline = config.redis.response_timeout;
    let watch = health.watch(reporter, deadline, started.tasks.clone());
    started.tracker.spawn(watch);
    // Both reflection versions: v1alpha is what many grpcurl builds and
    // other tools still ask for.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let batcher = BatcherServer::new(service)
        .max_decoding_message_size(config.limits.max_message_bytes.as_u64() as usize);
    let batcher = Deadlines::new(batcher, deadline).refusing_after(started.closing.clone());
    Ok(tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(metrics::Requests::new(auth.guard(batcher))))
}

/// Re-reads the config file on SIGHUP and swaps in its policies, TLS
/// certificates, tokens and sinks. A bad file is logged and what is in force stays.
async fn reload_on_sighup(
    path: PathBuf,
    policies: Option<PolicyHandle>,
    edge: Edge,
    sinks: crate::sinks::Sinks,
    shutdown: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(%err, "cannot listen for SIGHUP; config reload disabled");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = hangups.recv() => {}
        }
        // Reading and compiling a large file takes a while; on a thread of
        // the blocking pool, the runtime's worker goes on serving calls.
        let file = path.clone();
        let compile = policies.is_some();
        let loaded = tokio::task::spawn_blocking(move || {
            Config::load(&file).map(|config| (compile.then(|| config.policies()), config))
        })
        .await;
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(err) => {
                tracing::error!(%err, "config reload failed; keeping the config in force");
                continue;
            }
        };
        match loaded {
            Ok((compiled, config)) => {
                if let (Some(policies), Some(compiled)) = (&policies, compiled) {
                    policies.replace(compiled);
                }
                tls::reload(edge.tls.as_ref(), config.tls.as_ref());
                edge.auth.reload(config.auth.as_ref());
                sinks.reload(&config.sinks).await;
                tracing::info!(path = %path.display(), "config reloaded");
            }
            Err(err) => {
                tracing::error!(%err, "config reload failed; keeping the config in force")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// The order in which one worker runs three tasks that a task on it
    /// spawns one after another: with the LIFO slot the last one spawned
    /// jumps the queue (3, 1, 2); without it they run as spawned.
    fn spawn_order(runtime: &tokio::runtime::Runtime) -> Vec<u8> {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let parent = runtime.spawn({
            let ran = ran.clone();
            async move {
                let children: Vec<_> = (1..=3u8)
                    .map(|n| {
                        let ran = ran.clone();
                        tokio::spawn(async move { ran.lock().unwrap().push(n) })
                    })
                    .collect();
                for child in children {
                    child.await.unwrap();
                }
            }
        });
        runtime.block_on(parent).unwrap();
        ran.lock().unwrap().clone()
    }

    /// The build sees `--cfg tokio_unstable` from `.cargo/config.toml`,
    /// without which `runtime` would keep tokio's LIFO slot: its worker runs
    /// spawned tasks in the order they were spawned, where a runtime with
    /// the slot runs the last one first.
    #[test]
    fn the_runtime_is_built_without_the_lifo_slot() {
        const {
            assert!(
                cfg!(tokio_unstable),
                "built without --cfg tokio_unstable (is RUSTFLAGS set?)"
            )
        };
        let with_slot = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert_eq!(spawn_order(&with_slot), [3, 1, 2], "the slot's order");
        let runtime = super::runtime(1).expect("runtime");
        assert_eq!(spawn_order(&runtime), [1, 2, 3]);
    }
}
