//! The service under test: the one config every scenario runs (which
//! `--print-config` prints), and the [`Env`] that gives each scenario a
//! fresh service, over an emptied Redis when the bench owns it.

use std::net::SocketAddr;
use std::time::Duration;

use batcher::config::Config;
use batcher::keys::Keyspace;
use batcher::pb;
use batcher_testkit::Wait;

use super::load;
use super::policies::RULES_CONFIG;
use super::procs::{self, RedisServer, ServiceProc};
use super::scenarios::{Target, precision_waits};

/// How long a fresh service may take to answer a call that reaches Redis.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// The pause between two calls while it does not answer.
const READY_POLL: Duration = Duration::from_millis(50);

/// The shards of the service under test unless `--shards` says otherwise:
/// the default of `[redis] shards`.
pub const SHARDS: u16 = 16;

/// The service config every scenario runs with, in `shards` shards, on
/// `worker_threads` threads (the service's default without). One config
/// for all, with a key glob per scenario policy, so that an external
/// service can run it too.
pub fn service_config(redis_url: &str, shards: u16, worker_threads: Option<u16>) -> String {
    let config = config_with(&format!("url = \"{redis_url}\""), shards);
    match worker_threads {
        Some(threads) => format!("worker_threads = {threads}\n{config}"),
        None => config,
    }
}

/// The same config on a Redis Cluster (scenario 9): `[redis] cluster_nodes`
/// names the seed nodes instead of `url`.
pub fn cluster_config(nodes: &[String]) -> String {
    let quoted: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
    config_with(&format!("cluster_nodes = [{}]", quoted.join(", ")), SHARDS)
}

/// The bench's config, with `redis_line` saying where Redis is.
fn config_with(redis_line: &str, shards: u16) -> String {
    let mut config = format!(
        r#"shutdown_grace = "1s"

# A free port each, so bench processes never collide on the default.
[http]
listen = "127.0.0.1:0"

[redis]
{redis_line}
prefix = "bench"
shards = {shards}

# Ingest (scenarios 1, 2, 9 and 11's plain run), fan-out (scenario 4) and
# the dedup sets (scenario 8): groups flush by size.
# The wait is long so that groups left open by one scenario never time out
# during a later one.
[defaults]
max_items = 10
max_wait = "1h"

# Scale, memory and RSS (scenarios 5 to 7): one-item groups that stay open.
[keys."sc-*"]
max_items = 1000
max_wait = "1h"
{RULES_CONFIG}
# Timeout precision (scenario 3): one glob per wait, full and quick runs.
"#
    );
    let mut waits: Vec<Duration> = precision_waits(false);
    waits.extend(precision_waits(true));
    waits.sort();
    waits.dedup();
    for wait in waits {
        let ms = wait.as_millis();
        config += &format!("[keys.\"tp-{ms}-*\"]\nmax_wait = \"{ms}ms\"\n");
    }
    config
}

/// The Redis and service the scenarios run against, and how to renew them.
pub struct Env {
    pub redis_url: String,
    /// The bench's own redis-server; None when given --redis-url.
    pub redis: Option<RedisServer>,
    external_service: Option<SocketAddr>,
    /// The service under test, when the bench runs it; dropping it stops it.
    pub service: Option<ServiceProc>,
    /// The config text the service runs, and what it parses to.
    pub config_text: String,
    pub config: Config,
}

impl Env {
    /// Starts the bench's own Redis unless `redis_url` is given, and parses
    /// the service config for it, in `shards` shards on `worker_threads`
    /// threads; no service runs yet.
    pub async fn start(
        redis_url: Option<String>,
        external_service: Option<SocketAddr>,
        shards: u16,
        worker_threads: Option<u16>,
    ) -> Result<Env, String> {
        let redis = match redis_url {
            Some(_) => None,
            None => Some(procs::start_redis()?),
        };
        let redis_url = redis_url
            .or_else(|| redis.as_ref().map(RedisServer::url))
            .expect("a Redis URL");
        let config_text = service_config(&redis_url, shards, worker_threads);
        let config = Config::parse(&config_text, "bench")
            .map_err(|e| format!("the bench's own config is invalid: {e}"))?;
        Ok(Env {
            redis_url,
            redis,
            external_service,
            service: None,
            config_text,
            config,
        })
    }

    /// Whether the bench starts the service itself (no --service).
    pub fn runs_service(&self) -> bool {
        self.external_service.is_none()
    }

    /// The keyspace the service writes.
    pub fn keyspace(&self) -> Keyspace {
        Keyspace::new(&self.config.redis.prefix, self.config.redis.shards.get())
    }

    /// A clean slate for a scenario: stops the previous service, empties the
    /// bench's own Redis when `flush`, and starts a fresh service. Must be
    /// awaited from the main future (it spawns a child).
    pub async fn fresh(&mut self, flush: bool) -> Result<Target, String> {
        self.service = None;
        if flush {
            self.flush().await?;
        }
        let (addr, service_pid) = match self.external_service {
            Some(addr) => (addr, None),
            None => {
                let service = ServiceProc::start(&self.config_text).await?;
                let started = (service.addr, Some(service.pid()));
                self.service = Some(service);
                started
            }
        };
        wait_ready(addr).await?;
        Ok(Target {
            addr,
            service_pid,
            redis_pid: self.redis.as_ref().and_then(RedisServer::pid),
            redis_url: self.redis_url.clone(),
            masters: Vec::new(),
        })
    }

    /// The frozen service floor (row 2c, `floor_serve.rs`) in place of the
    /// service, over an emptied Redis. Only with the bench's own Redis and
    /// service, whose CPU it meters.
    pub async fn floor(&mut self) -> Result<Target, String> {
        self.floor_of(false).await
    }

    /// The frozen AddMany service floor (row 1c, `floor_serve_many.rs`), as
    /// [`Env::floor`].
    pub async fn floor_many(&mut self) -> Result<Target, String> {
        self.floor_of(true).await
    }

    async fn floor_of(&mut self, many: bool) -> Result<Target, String> {
        if self.redis.is_none() || self.external_service.is_some() {
            return Err("needs the bench's own Redis and service".into());
        }
        self.service = None;
        self.flush().await?;
        let floor = if many {
            ServiceProc::start_floor_many(&self.redis_url).await?
        } else {
            ServiceProc::start_floor(&self.redis_url).await?
        };
        let target = Target {
            addr: floor.addr,
            service_pid: Some(floor.pid()),
            redis_pid: self.redis.as_ref().and_then(RedisServer::pid),
            redis_url: self.redis_url.clone(),
            masters: Vec::new(),
        };
        self.service = Some(floor);
        Ok(target)
    }

    /// Stops the service and empties the bench's own Redis, for a scenario
    /// that starts services of its own; refused with an external Redis or
    /// service.
    pub async fn empty(&mut self) -> Result<(), String> {
        if self.redis.is_none() || self.external_service.is_some() {
            return Err("needs the bench's own Redis and service".into());
        }
        self.service = None;
        self.flush().await
    }

    /// FLUSHALL of the bench's own Redis; an external one is never flushed.
    async fn flush(&self) -> Result<(), String> {
        if self.redis.is_none() {
            return Ok(());
        }
        // FLUSHALL of a million groups takes longer than a connection's
        // default 500 ms response timeout.
        let client = redis::Client::open(self.redis_url.as_str()).map_err(|e| e.to_string())?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("redis: {e}"))?;
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| format!("FLUSHALL: {e}"))
    }
}

/// Waits until the service answers a call that reaches Redis.
pub async fn wait_ready(addr: SocketAddr) -> Result<(), String> {
    let wait = Wait::new(format!("the service at {addr} to be ready"), READY_TIMEOUT);
    let ready = wait.every(READY_POLL).until_ok(|| async move {
        let mut client = load::connect(addr).await?;
        let request = pb::GetGroupRequest {
            key: "bench-ready".into(),
        };
        match client.get_group(request).await {
            Ok(_) => Ok(()),
            Err(status) => Err(status.message().to_string()),
        }
    });
    ready.await.map_err(|e| e.to_string())
}
