//! Test support: what only the tests need (the service in-process, test
//! configs, reading the store, assertions on statuses and Redis's command
//! counts), over the harness that the tests share with the bench, the
//! `batcher-testkit` crate: real Redis servers (`redis`, `cluster`), the
//! service as a child process (`Process`), clients, held ports and waits with
//! deadlines, re-exported here under the names the tests use.
#![allow(dead_code)]

pub mod browser;
pub mod cli;
pub mod cluster;
pub mod layout;
pub mod load;
pub mod policy;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod scrape;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use batcher::batch::{Batch, StreamId};
use batcher::config::Config;
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use batcher::policy::PolicyHandle;
use batcher::store::{Endpoint, RedisTarget, Store, Timeouts};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use self::redis::RedisServer;
pub use batcher_testkit::{DEADLINE, HeldPort, Process, Spawn, channel, client, eventually};

/// `batcher serve --config <config_path>` of this package's binary, logging
/// into `log_dir`: `.start()` it (until it accepts gRPC connections) or
/// `.bound()` it (until it has bound its port).
pub fn serve(config_path: &Path, log_dir: &Path) -> Spawn {
    Spawn::serve(env!("CARGO_BIN_EXE_batcher"), config_path, log_dir)
}

/// A config for tests against `url`: `extra` TOML (top-level keys, then
/// tables other than `[redis]`), then the `[redis]` table. `[http] listen`
/// is 127.0.0.1:0, so parallel tests never collide on the default port.
pub fn config(url: &str, extra: &str) -> Config {
    let text = config_text(url, extra);
    let mut config =
        Config::parse(&text, "test.toml").unwrap_or_else(|e| panic!("test config: {e}"));
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config
}

/// The text of [`config`], for a config file: `extra`, then `[redis]` with
/// `url` and the tests' 4 shards.
pub fn config_text(url: &str, extra: &str) -> String {
    format!("{extra}\n[redis]\nurl = \"{url}\"\nshards = 4\n")
}

/// Writes `text` as `batcher.toml` in `dir` and starts `batcher serve` on
/// it, logging into `dir` too.
pub async fn process_with(dir: &Path, text: &str) -> Process {
    let path = dir.join("batcher.toml");
    std::fs::write(&path, text).expect("write the config file");
    serve(&path, dir).start().await
}

/// The service running in this process on a free port.
pub struct Service {
    pub addr: SocketAddr,
    /// Where `GET /metrics` is served (a free port too); None when the
    /// config disables `[http]`.
    pub http_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<(), batcher::server::ServerError>>,
}

impl Service {
    /// Starts the service with `config` on 127.0.0.1:0, and its HTTP
    /// listener (unless disabled) on another free port, whatever
    /// `[http] listen` says.
    pub async fn start(config: Config) -> Service {
        Service::start_on(batcher_testkit::listener().await, config).await
    }

    /// [`Service::start`] on `listener`: a test that binds a fixed address
    /// can stop the service and start another where its clients point.
    pub async fn start_on(listener: tokio::net::TcpListener, config: Config) -> Service {
        let addr = listener.local_addr().expect("local addr");
        let http = match config.http.enabled {
            true => Some(batcher_testkit::listener().await),
            false => None,
        };
        let http_addr = http.as_ref().map(|l| l.local_addr().expect("local addr"));
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(batcher::server::run(
            listener,
            http,
            config,
            None,
            shutdown.clone(),
        ));
        Service {
            addr,
            http_addr,
            shutdown,
            handle,
        }
    }

    /// A connected client.
    pub async fn client(&self) -> BatcherClient<Channel> {
        client(self.addr).await
    }

    /// Stops the service and checks that it shut down cleanly, in time.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(DEADLINE, self.handle)
            .await
            .expect("service did not stop within the deadline")
            .expect("service task panicked");
        result.expect("service returned an error");
    }
}

/// The error that stops the service from starting on `config`.
pub async fn start_error(config: Config) -> String {
    let listener = batcher_testkit::listener().await;
    let run = batcher::server::run(listener, None, config, None, CancellationToken::new());
    let result = tokio::time::timeout(DEADLINE, run).await;
    result
        .expect("the start did not fail in time")
        .unwrap_err()
        .to_string()
}

/// The stream of `shard` under the default prefix and the tests' 4 shards.
pub fn stream_key(shard: u16) -> String {
    Keyspace::new("batcher", 4).shard(shard).stream
}

/// Waits until the standard health service reports `want` for the Batcher
/// service at `addr`.
pub async fn wait_health(
    addr: SocketAddr,
    want: tonic_health::pb::health_check_response::ServingStatus,
) {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let health = HealthClient::new(channel(addr));
    eventually(&format!("health to report {want:?}"), || {
        let mut health = health.clone();
        async move {
            let service = "batcher.v1.Batcher".to_owned();
            let resp = health.check(HealthCheckRequest { service }).await.ok()?;
            (resp.into_inner().status == want as i32).then_some(())
        }
    })
    .await;
}

/// One AddMany call of `items`; its results, in request order.
pub async fn add_many(
    client: &mut BatcherClient<tonic::transport::Channel>,
    items: Vec<pb::AddRequest>,
) -> Vec<pb::AddResponse> {
    client
        .add_many(pb::AddManyRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results
}

/// Builds an AddRequest.
pub fn add(key: &str, id: &str, payload: &[u8]) -> pb::AddRequest {
    pb::AddRequest {
        key: key.into(),
        item: Some(pb::Item {
            id: id.to_string(),
            payload: payload.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Receives the next batch from a subscription, or panics after DEADLINE.
pub async fn next_batch(stream: &mut tonic::Streaming<pb::Batch>) -> pb::Batch {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("no batch arrived within the deadline")
        .expect("subscription failed")
        .expect("subscription ended")
}

/// A store over the same Redis as `config`, for reading state directly.
pub fn store(config: &Config) -> Store {
    let endpoint = match &config.redis.url {
        Some(url) => Endpoint::Single(url.clone()),
        None => Endpoint::Cluster(config.redis.cluster_nodes.clone()),
    };
    let target = RedisTarget {
        endpoint,
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
        },
        wait: None,
        tls_ca: config
            .redis
            .tls_ca_file
            .as_ref()
            .map(|f| std::fs::read(f).unwrap()),
        password: None,
    };
    Store::open(
        &target,
        Keyspace::new(&config.redis.prefix, config.redis.shards.get()),
        config.dedup.window,
        PolicyHandle::new(config.policies()),
    )
    .expect("store")
}

/// Every batch retained in every shard stream, in stream order per shard.
pub async fn all_batches(store: &Store) -> Vec<Batch> {
    let mut out = Vec::new();
    for shard in 0..store.keyspace().shards() {
        let mut after = StreamId::ZERO;
        loop {
            let page = store
                .read_batches(shard, after, 1000)
                .await
                .expect("read stream");
            let Some(last) = page.last() else { break };
            after = last.stream_id;
            out.extend(page);
        }
    }
    out
}

/// How many batches hold each (key, item id), over all retained batches.
pub fn placements(batches: &[Batch]) -> HashMap<(String, String), usize> {
    let mut seen = HashMap::new();
    for batch in batches {
        for item in &batch.items {
            *seen
                .entry((
                    batch.key.clone(),
                    String::from_utf8_lossy(&item.id).into_owned(),
                ))
                .or_insert(0) += 1;
        }
    }
    seen
}

/// Asserts that `status` is INVALID_ARGUMENT with a message naming `field`,
/// an `ErrorInfo` (reason INVALID_FIELD, domain batcher) and a `BadRequest`
/// whose first violation is `field`.
#[track_caller]
pub fn assert_invalid(status: &tonic::Status, field: &str) {
    use tonic_types::StatusExt;
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{field}: {status:?}"
    );
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "expected a message naming {field}: {}",
        status.message()
    );
    assert_error_info(status, "INVALID_FIELD");
    let bad = status
        .get_details_bad_request()
        .expect("a BadRequest detail");
    assert_eq!(bad.field_violations[0].field, field, "{bad:?}");
}

/// Asserts that `status` carries a `google.rpc.ErrorInfo` with `reason` in
/// the `batcher` domain, and returns its metadata.
#[track_caller]
pub fn assert_error_info(status: &tonic::Status, reason: &str) -> HashMap<String, String> {
    use tonic_types::StatusExt;
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, reason, "{status:?}");
    assert_eq!(info.domain, "batcher", "{status:?}");
    info.metadata
}

/// The commands a script call can be counted under.
const SCRIPT_CALLS: &[&str] = &["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];

/// Waits until each of the 4 test shards' sweepers has scanned once: before
/// any add, the sweepers' due scans are the only scripts run on a fresh
/// Redis, and each scans once before its first sleep.
pub async fn wait_for_first_sweeps(redis: &RedisServer) {
    eventually("each sweeper's first scan", || {
        let scans = command_calls(redis, SCRIPT_CALLS);
        async move { (scans >= 4).then_some(()) }
    })
    .await;
}

/// How many times Redis has run the named commands successfully so far
/// (from INFO commandstats; failed calls are not counted). Lets a test wait
/// for work the service does on its own, such as a sweep or a trim.
pub fn command_calls(redis: &RedisServer, commands: &[&str]) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let mut total = 0;
    for line in stats.lines() {
        let Some((name, fields)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        if !commands.contains(&name) {
            continue;
        }
        let field = |wanted: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(wanted)?.strip_prefix('='))
                .map_or(0, |v| v.parse().expect("a commandstats counter"))
        };
        total += field("calls") - field("failed_calls");
    }
    total
}

/// Waits until Redis has run the named commands `more` further times.
pub async fn wait_for_calls(redis: &RedisServer, commands: &[&str], more: u64) {
    let target = command_calls(redis, commands) + more;
    eventually(&format!("{more} more calls of {commands:?}"), || {
        let done = command_calls(redis, commands) >= target;
        async move { done.then_some(()) }
    })
    .await;
}

/// A redis-server hung with SIGSTOP, as a stalled Redis would be: it keeps
/// its connections but answers nothing. SIGCONT when dropped, so a failing
/// test does not leave it stopped.
pub struct Paused(u32);

impl Paused {
    pub fn new(redis: &RedisServer) -> Paused {
        let pid = redis.pid().expect("redis-server runs");
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Batches retained over the 4 shard streams of a test config.
pub fn stream_len(redis: &RedisServer) -> usize {
    (0..4)
        .map(|shard| {
            let out = redis.cli(&["XLEN", &stream_key(shard)]);
            out.parse::<usize>()
                .unwrap_or_else(|_| panic!("XLEN answered {out:?}"))
        })
        .sum()
}
