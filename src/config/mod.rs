//! The service's configuration: the TOML file format, its defaults, and how
//! its policy tables become the runtime [`Policies`].
//!
//! [`Config::load`] reads, parses and validates a file in one step; every
//! error it returns names the file, the table, the field and (when it is
//! written in the file) its line, on one line (see [`error`]). Values are
//! typed so that serde rejects what no type allows: durations go through
//! `humantime-serde`, sizes through `bytesize`, counts that must be at least
//! 1 are `NonZero*`, closed sets are enums, and times of day and time zones
//! are parsed by their own types (see [`PolicyDefaults`]). [`validate`] keeps the rest:
//! rules that relate fields to each other and bounds no type expresses.
//!
//! ```toml
//! listen = "127.0.0.1:50051"
//!
//! [redis]
//! url = "redis://127.0.0.1:6379"   # omit to run the embedded redis-server
//! # cluster_nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]  # instead of url
//! prefix = "batcher"
//! shards = 16
//!
//! [defaults]
//! max_items = 10
//! max_wait = "4m"
//!
//! [keys."north"]                   # an exact key
//! max_items = 25
//!
//! [keys."south-*"]                 # a glob: '*' matches any run of characters
//! max_wait = "30s"
//! ```

pub mod error;
pub mod guard;
mod policy;
pub mod sink;
#[cfg(test)]
mod tests;
pub mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::num::{NonZeroU16, NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

pub use self::error::ConfigError;
pub use self::guard::{AuthConfig, HttpConfig, LogConfig, LogFormat, Role, TlsConfig, TokenConfig};
pub use self::policy::{
    CutoffTimes, DEFAULT_DEADLINE_LEAD, DEFAULT_MIN_ITEMS, DEFAULT_TIMEZONE, KeyPolicy,
    PolicyDefaults, PolicyStoreConfig, TimeZoneName,
};
pub use self::sink::{SinkConfig, SinkKind, SinkOptions, WebhookOptions};
pub use self::validate::Violation;
use crate::policy::{Policies, Policy};

// ---------------------------------------------------------------------------
// Defaults and bounds
// ---------------------------------------------------------------------------

/// `NonZero` constants, checked at compile time.
const fn nz32(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("a default count is at least 1")
}
const fn nzsize(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("a default count is at least 1")
}

/// Default gRPC listen address.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 50051));
/// Default data directory of the embedded redis-server.
pub const DEFAULT_REDIS_DATA_DIR: &str = "./data";
/// Default prefix of every Redis key the service writes.
pub const DEFAULT_REDIS_PREFIX: &str = "batcher";
/// Default number of shards.
pub const DEFAULT_REDIS_SHARDS: NonZeroU16 = NonZeroU16::new(16).expect("16 is not 0");
/// Default redis-server binary for embedded mode (looked up on `PATH`).
pub const DEFAULT_REDIS_SERVER: &str = "redis-server";
/// Default longest `WAIT` for replicas after a write.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(50);
/// Default `appendfsync` of the embedded redis-server.
pub const DEFAULT_APPENDFSYNC: AppendFsync = AppendFsync::Always;
/// Default Redis connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default Redis response timeout: the deadline of each call.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Default `[defaults] max_items`.
pub const DEFAULT_MAX_ITEMS: NonZeroU32 = nz32(10);
/// Default `[defaults] max_wait` (4 minutes).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(4 * 60);
/// Default `[defaults] max_bytes`: no byte threshold.
pub const DEFAULT_MAX_BYTES: Option<ByteSize> = None;

/// Default `[limits] max_key_bytes`.
pub const DEFAULT_MAX_KEY_BYTES: ByteSize = ByteSize::b(256);
/// Default `[limits] max_item_id_bytes`.
pub const DEFAULT_MAX_ITEM_ID_BYTES: ByteSize = ByteSize::b(256);
/// Default `[limits] max_payload_bytes` (64 KiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: ByteSize = ByteSize::kib(64);
/// Default `[limits] max_items`: the largest `max_items` a policy may set.
pub const DEFAULT_LIMIT_MAX_ITEMS: NonZeroU32 = nz32(10_000);
/// Default `[limits] max_add_many`.
pub const DEFAULT_MAX_ADD_MANY: NonZeroUsize = nzsize(10_000);

/// Default `[limits] max_subscribers`.
pub const DEFAULT_MAX_SUBSCRIBERS: NonZeroUsize = nzsize(10_000);
/// Default `[limits] max_message_bytes` (64 MiB: an AddMany of many items).
pub const DEFAULT_MAX_MESSAGE_BYTES: ByteSize = ByteSize::mib(64);
/// Default `[limits] max_queued_adds`, per shard: 16 shards × 500 items
/// drain in about 0.25 s at 32k items/s (the bench's AddMany rate on a
/// 2-core machine), well within the default 2 s deadline.
pub const DEFAULT_MAX_QUEUED_ADDS: NonZeroUsize = nzsize(500);
/// Default `[subscriptions] max_unacked`, per durable consumer.
pub const DEFAULT_MAX_UNACKED: NonZeroU32 = nz32(64);

/// Default `[dedup] window` (10 minutes).
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Default `[sweeper] max_sleep`.
pub const DEFAULT_SWEEPER_MAX_SLEEP: Duration = Duration::from_millis(250);
/// Default `[sweeper] batch`.
pub const DEFAULT_SWEEPER_BATCH: NonZeroUsize = nzsize(256);
/// Default `[subscriptions] retention` (24 hours).
pub const DEFAULT_SUBSCRIPTIONS_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default `[subscriptions] ack_timeout`.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `[subscriptions] max_deliveries`.
pub const DEFAULT_MAX_DELIVERIES: NonZeroU32 = nz32(5);
/// Default `[subscriptions] trim_every`.
pub const DEFAULT_TRIM_EVERY: Duration = Duration::from_secs(60);
/// Default `[subscriptions] buffer`.
pub const DEFAULT_SUBSCRIPTIONS_BUFFER: NonZeroUsize = nzsize(1024);
/// Default `drain_delay`: longer than a load balancer's or a Kubernetes
/// readiness probe's period (10 s by default in Kubernetes, though 1 to 5 s
/// is common for services that drain), so that the probe sees NOT_SERVING
/// and takes the instance out of rotation before it refuses calls. Set it
/// to the probe's `periodSeconds` times its `failureThreshold`, plus the
/// time the load balancer takes to act on it.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);
/// Default `drain_timeout`: the most the end of a drain (calls in flight
/// answered, streams ended, deliveries released, background tasks stopped)
/// may take before it is cut short.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Most `worker_threads` the service may ask for.
pub const MAX_WORKER_THREADS: usize = 256;

/// Default `worker_threads`: one for a single Redis (`[redis] url`, or the
/// embedded one), one per core the service may run on for a cluster, at
/// most [`MAX_WORKER_THREADS`].
///
/// A single Redis runs its commands on one thread, and one service thread
/// keeps pace with it at about two thirds of the CPU per unary add that two
/// threads spend, where requests, their shard writer and their connections
/// wake one another across threads. A cluster has a thread per master to
/// feed, so the service gets one per core (docs/operations.md#threads).
pub fn default_worker_threads(cluster: bool) -> NonZeroUsize {
    if !cluster {
        return NonZeroUsize::MIN;
    }
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    NonZeroUsize::new(cores.min(MAX_WORKER_THREADS)).unwrap_or(NonZeroUsize::MIN)
}

/// Most shards `redis.shards` may ask for.
pub const MAX_SHARDS: u16 = 1024;
/// Longest `max_wait` a policy may set (30 days).
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Largest `limits.max_key_bytes` and `limits.max_item_id_bytes`.
pub const MAX_ID_BYTES_LIMIT: u64 = 65_536;
/// Largest `limits.max_payload_bytes` (512 MiB, Redis' own string limit).
pub const MAX_PAYLOAD_BYTES_LIMIT: u64 = 512 * 1024 * 1024;

// ---------------------------------------------------------------------------
// The configuration
// ---------------------------------------------------------------------------

/// The whole configuration file. Every table and field is optional; an empty
/// file gives [`Config::default()`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the gRPC server binds; an IP and port, not a host name, so that
    /// startup never depends on name resolution.
    pub listen: SocketAddr,
    /// The threads of the runtime that serves every call, stream and
    /// background task. Read at start-up only; unset, the default depends on
    /// the Redis ([`Config::worker_threads`]).
    pub worker_threads: Option<NonZeroUsize>,
    /// Where the state lives.
    pub redis: RedisConfig,
    /// The flush policy of every key no `[keys."..."]` table matches, and the
    /// fallback for the fields a matching table leaves unset.
    pub defaults: PolicyDefaults,
    /// Per-key overrides, by exact key or `*` glob. A `BTreeMap` so that
    /// iteration (and so validation's first error) is deterministic.
    pub keys: BTreeMap<String, KeyPolicy>,
    /// Size limits on requests, so one client cannot exhaust Redis' memory.
    pub limits: Limits,
    /// Duplicate suppression of item ids.
    pub dedup: DedupConfig,
    /// The background task that flushes groups whose time is up.
    pub sweeper: SweeperConfig,
    /// Delivery of flushed batches to subscribers.
    pub subscriptions: SubscriptionsConfig,
    /// How long the service serves on after SIGTERM (or SIGINT) with its
    /// health NOT_SERVING and `/readyz` 503, so that load balancers move
    /// traffic away before it refuses calls (see [`DEFAULT_DRAIN_DELAY`]).
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// Once the delay is over, the most the rest of the drain may take:
    /// calls in flight answered, subscription streams ended, durable
    /// deliveries released, the sweeper's pass and the other background
    /// tasks. When it is up (or at a second signal) the service stops at
    /// once. `shutdown_grace`, its former name, is still read.
    #[serde(with = "humantime_serde", alias = "shutdown_grace")]
    pub drain_timeout: Duration,
    /// TLS on the gRPC port; plaintext without this table.
    pub tls: Option<TlsConfig>,
    /// Bearer tokens with roles and key scopes; auth is off without this table.
    pub auth: Option<AuthConfig>,
    /// The HTTP listener of `GET /metrics`.
    pub http: HttpConfig,
    /// The format of log lines.
    pub log: LogConfig,
    /// Policies as shared live data in Redis instead of this file's tables.
    pub policy_store: PolicyStoreConfig,
    /// Where the service delivers batches itself (`[[sinks]]`, see
    /// docs/sinks.md); reloaded on SIGHUP.
    pub sinks: Vec<SinkConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN,
            worker_threads: None,
            redis: RedisConfig::default(),
            defaults: PolicyDefaults::default(),
            keys: BTreeMap::new(),
            limits: Limits::default(),
            dedup: DedupConfig::default(),
            sweeper: SweeperConfig::default(),
            subscriptions: SubscriptionsConfig::default(),
            drain_delay: DEFAULT_DRAIN_DELAY,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            tls: None,
            auth: None,
            http: HttpConfig::default(),
            log: LogConfig::default(),
            policy_store: PolicyStoreConfig::default(),
            sinks: Vec::new(),
        }
    }
}

/// The AOF fsync policy of the embedded redis-server, as Redis names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppendFsync {
    /// Fsync every write: an acknowledged item survives a crash.
    #[default]
    Always,
    /// Fsync once a second: a crash may lose the last second of adds.
    Everysec,
    /// Leave fsync to the OS: fastest, least durable.
    No,
}

impl AppendFsync {
    /// The value as `redis-server --appendfsync` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            AppendFsync::Always => "always",
            AppendFsync::Everysec => "everysec",
            AppendFsync::No => "no",
        }
    }
}

impl fmt::Display for AppendFsync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[redis]`: which Redis to use and how to name keys in it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// URL of an external Redis. With neither this nor `cluster_nodes`, an
    /// embedded redis-server starts, so that a single binary can run with no
    /// other setup.
    pub url: Option<String>,
    /// Seed nodes of a Redis Cluster (the rest are discovered); exclusive
    /// with `url`. Credentials and `rediss://` work as in `url`.
    pub cluster_nodes: Vec<String>,
    /// How many replicas must confirm each write before it is acknowledged
    /// (`WAIT` after every write script); 0 = do not wait. Needs `url` or
    /// `cluster_nodes`: the embedded redis-server has no replicas.
    pub wait_replicas: u32,
    /// How long `WAIT` may block; fewer confirmations by then fail the call
    /// with UNAVAILABLE (retrying is safe: adds are idempotent).
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Duration,
    /// A PEM file of the root CA(s) that signed the Redis server's TLS
    /// certificate, for `rediss://` URLs (a relative path is taken from the
    /// working directory). Without it, the public web PKI roots are trusted.
    pub tls_ca_file: Option<PathBuf>,
    /// A file holding the Redis password (one line; a trailing newline is
    /// dropped), so it need not sit in the URL. Used for `url` and every
    /// `cluster_nodes` entry that carries no password of its own.
    pub password_file: Option<PathBuf>,
    /// Embedded mode only: where the embedded server keeps its AOF/RDB files,
    /// so that state survives restarts.
    pub data_dir: PathBuf,
    /// Prefix of every key, so several deployments can share one Redis. It
    /// becomes part of a `{...}` hash tag, hence no braces or whitespace.
    pub prefix: String,
    /// Number of shards groups are spread over; each shard has its own due
    /// set, stream and sweeper, and maps to one Redis Cluster slot.
    pub shards: NonZeroU16,
    /// Embedded mode only: the redis-server binary, a path or a name on `PATH`,
    /// for systems where it is installed elsewhere or under another name.
    pub redis_server: PathBuf,
    /// Embedded mode only: the AOF fsync policy. `always` (the default)
    /// means an acknowledged item survives a crash; the others trade that for
    /// throughput.
    pub appendfsync: AppendFsync,
    /// How long to wait for a connection, so startup fails fast on a wrong URL.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The deadline of each gRPC call, however many Redis commands it
    /// issues and however long it queues for its shard; a client's shorter
    /// `grpc-timeout` wins. A call not answered by then fails UNAVAILABLE, so
    /// a stalled Redis turns into errors instead of piled-up requests. The
    /// background tasks (sweeper, subscriptions) bound each command by it.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            cluster_nodes: Vec::new(),
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            tls_ca_file: None,
            password_file: None,
            data_dir: PathBuf::from(DEFAULT_REDIS_DATA_DIR),
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            shards: DEFAULT_REDIS_SHARDS,
            redis_server: PathBuf::from(DEFAULT_REDIS_SERVER),
            appendfsync: DEFAULT_APPENDFSYNC,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

/// `[limits]`: caps on what one request may carry, so one client cannot
/// exhaust Redis' memory or stall a shard. Byte fields take an integer or a
/// size string such as `"64KiB"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Longest group key, in bytes: keys are stored in every shard structure.
    pub max_key_bytes: ByteSize,
    /// Longest item id, in bytes: ids are remembered for the dedup window.
    pub max_item_id_bytes: ByteSize,
    /// Largest payload of one item, in bytes.
    pub max_payload_bytes: ByteSize,
    /// Largest `max_items` a policy may set: bounds the size of one flush,
    /// which runs as a single Redis script.
    pub max_items: NonZeroU32,
    /// Most items in one AddMany call: bounds one request's script run time.
    pub max_add_many: NonZeroUsize,
    /// Most subscribers (live and durable) one instance serves at once.
    pub max_subscribers: NonZeroUsize,
    /// Largest gRPC request message the server decodes.
    pub max_message_bytes: ByteSize,
    /// Most items one shard's writer holds, queued or in flight to Redis;
    /// an add (or an AddMany's part for the shard) that does not fit fails
    /// at once with RESOURCE_EXHAUSTED, and AddMany queues nothing then. It
    /// sets how long an accepted add may wait under overload: about
    /// `shards × max_queued_adds` ÷ the items per second Redis takes, which
    /// must stay well under the per-call deadline (`[redis] response_timeout`).
    pub max_queued_adds: NonZeroUsize,
    /// Most groups open at once over all keys (0: no limit), split evenly
    /// over the shards, each enforcing its part atomically. What an add
    /// past it does is its key's policy's `overflow`.
    pub max_open_groups: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_item_id_bytes: DEFAULT_MAX_ITEM_ID_BYTES,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_items: DEFAULT_LIMIT_MAX_ITEMS,
            max_add_many: DEFAULT_MAX_ADD_MANY,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_queued_adds: DEFAULT_MAX_QUEUED_ADDS,
            max_open_groups: 0,
        }
    }
}

/// `[dedup]`: suppression of items re-sent after their group was flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DedupConfig {
    /// How long flushed item ids are remembered, so a client retry that
    /// arrives after the flush is not batched a second time.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            window: DEFAULT_DEDUP_WINDOW,
        }
    }
}

/// `[sweeper]`: the per-shard task that flushes groups whose `max_wait` is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweeperConfig {
    /// The longest a sweeper sleeps before re-checking its shard, so a group
    /// added by another process (which this one is not told about) is still
    /// flushed close to its due time.
    #[serde(with = "humantime_serde")]
    pub max_sleep: Duration,
    /// Most due groups read per sweep step, so one step's Redis call stays
    /// short even after a long outage left many groups overdue.
    pub batch: NonZeroUsize,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            max_sleep: DEFAULT_SWEEPER_MAX_SLEEP,
            batch: DEFAULT_SWEEPER_BATCH,
        }
    }
}

/// `[subscriptions]`: delivery of flushed batches to subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubscriptionsConfig {
    /// How long batches are kept in the shard streams, so a subscriber that
    /// reconnects can replay what it missed.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Per-subscriber queue length: bounds the memory one slow subscriber can
    /// hold. A live subscriber further behind catches up from Redis; a durable
    /// one takes no new batches until it has room.
    pub buffer: NonZeroUsize,
    /// How long a durable subscriber may hold a batch without acking it
    /// before it is redelivered to a live consumer of its group.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// After this many deliveries without an ack a batch is dead-lettered,
    /// so one poison batch cannot cycle through a group forever.
    pub max_deliveries: NonZeroU32,
    /// How often each shard's stream is trimmed to `retention`.
    #[serde(with = "humantime_serde")]
    pub trim_every: Duration,
    /// Prefetch limit of a durable consumer, in batches: its next batches
    /// are read from Redis only while it holds fewer than this many unacked,
    /// so `ack_timeout` starts when a batch is close to the consumer. Keep
    /// `max_unacked` times the consumer's time per batch well below
    /// `ack_timeout`, or batches time out while they wait in line.
    pub max_unacked: NonZeroU32,
}

impl Default for SubscriptionsConfig {
    fn default() -> Self {
        SubscriptionsConfig {
            retention: DEFAULT_SUBSCRIPTIONS_RETENTION,
            buffer: DEFAULT_SUBSCRIPTIONS_BUFFER,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            trim_every: DEFAULT_TRIM_EVERY,
            max_unacked: DEFAULT_MAX_UNACKED,
        }
    }
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

impl Config {
    /// Reads, parses and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates `text`; `origin` is the file name the error
    /// messages use.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let deserializer = toml::de::Deserializer::parse(text)
            .map_err(|err| ConfigError::syntax(origin, text, &err))?;
        let config: Config = serde_path_to_error::deserialize(deserializer)
            .map_err(|err| ConfigError::value(origin, text, &err))?;
        config
            .validate()
            .map_err(|violation| ConfigError::invalid(origin, text, violation))?;
        Ok(config)
    }

    /// Checks the rules no field's type expresses (see [`validate`]), then
    /// those of the guard-rail tables (see [`guard`]).
    pub fn validate(&self) -> Result<(), Violation> {
        validate::check(self)?;
        guard::check(self)?;
        sink::check(&self.sinks)
    }

    /// The threads of the service's runtime: `worker_threads` when set, else
    /// [`default_worker_threads`] for this Redis.
    pub fn worker_threads(&self) -> NonZeroUsize {
        self.worker_threads
            .unwrap_or_else(|| default_worker_threads(!self.redis.cluster_nodes.is_empty()))
    }

    /// The resolved policy table of this configuration: every
    /// `[keys."..."]` table merged over `[defaults]`.
    pub fn policies(&self) -> Policies {
        let defaults = self.defaults.policy();
        let patterns: Vec<(String, Policy)> = self
            .keys
            .iter()
            .map(|(pattern, table)| (pattern.clone(), table.over(&self.defaults).policy()))
            .collect();
        Policies::new(defaults, patterns)
    }

    /// This configuration with its policy tables replaced: `defaults` over
    /// the built-in defaults (the fields it leaves unset keep theirs), and
    /// `keys`. The policy rules the file's tables get are checked on them
    /// (against this configuration's `[limits]`); the first broken one is
    /// the error, with the path a file would have (`keys.<pattern>.<field>`).
    pub fn with_policies(
        &self,
        defaults: &KeyPolicy,
        keys: BTreeMap<String, KeyPolicy>,
    ) -> Result<Config, Violation> {
        let config = Config {
            defaults: defaults.over(&PolicyDefaults::default()),
            keys,
            ..self.clone()
        };
        validate::policies(&config)?;
        Ok(config)
    }

    /// The complete policy of one key table, `pattern`'s, over the complete
    /// `defaults` (a defaults table over the built-in ones, as
    /// [`Config::with_policies`] takes it), checked as `with_policies`
    /// checks each key table: what a change of that one table puts in a
    /// table whose defaults stay (see [`Policies::with_changes`]).
    pub fn key_policy(
        &self,
        defaults: &PolicyDefaults,
        pattern: &str,
        table: &KeyPolicy,
    ) -> Result<Policy, Violation> {
        validate::key_policy(self, defaults, pattern, table)?;
        Ok(table.over(defaults).policy())
    }
}
