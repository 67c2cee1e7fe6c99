//! The service's configuration: the TOML file format, its defaults, its
//! validation, and the resolved per-key flush policies.
//!
//! [`Config::load`] reads, parses and validates a file in one step; every
//! error it returns names the file, the table and the field at fault on one
//! line. The per-key `[keys."..."]` tables are resolved once into a
//! [`Policies`] table whose [`Policies::resolve`] is cheap enough for the hot
//! path, and a [`PolicyHandle`] shares that table between tasks so that it can
//! be swapped on reload without locking.
//!
//! ```toml
//! listen = "127.0.0.1:50051"
//!
//! [redis]
//! url = "redis://127.0.0.1:6379"   # omit to run the embedded redis-server
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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

// ---------------------------------------------------------------------------
// Defaults and bounds
// ---------------------------------------------------------------------------

/// Default gRPC listen address.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 50051));
/// Default data directory of the embedded redis-server.
pub const DEFAULT_REDIS_DATA_DIR: &str = "./data";
/// Default prefix of every Redis key the service writes.
pub const DEFAULT_REDIS_PREFIX: &str = "batcher";
/// Default number of shards.
pub const DEFAULT_REDIS_SHARDS: u16 = 16;
/// Default redis-server binary for embedded mode (looked up on `PATH`).
pub const DEFAULT_REDIS_SERVER: &str = "redis-server";
/// Default `appendfsync` of the embedded redis-server.
pub const DEFAULT_APPENDFSYNC: &str = "always";
/// The values `appendfsync` may take.
pub const APPENDFSYNC_VALUES: [&str; 3] = ["always", "everysec", "no"];
/// Default Redis connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default Redis response timeout.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Default `[defaults] max_items`.
pub const DEFAULT_MAX_ITEMS: u32 = 10;
/// Default `[defaults] max_wait` (4 minutes).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(4 * 60);
/// Default `[defaults] max_bytes`: no byte threshold.
pub const DEFAULT_MAX_BYTES: Option<u64> = None;

/// Default `[limits] max_key_bytes`.
pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
/// Default `[limits] max_item_id_bytes`.
pub const DEFAULT_MAX_ITEM_ID_BYTES: usize = 256;
/// Default `[limits] max_payload_bytes` (64 KiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Default `[limits] max_items`: the largest `max_items` a policy may set.
pub const DEFAULT_LIMIT_MAX_ITEMS: u32 = 10_000;
/// Default `[limits] max_add_many`.
pub const DEFAULT_MAX_ADD_MANY: usize = 10_000;

/// Default `[dedup] window` (10 minutes).
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Default `[sweeper] max_sleep`.
pub const DEFAULT_SWEEPER_MAX_SLEEP: Duration = Duration::from_millis(250);
/// Default `[sweeper] batch`.
pub const DEFAULT_SWEEPER_BATCH: usize = 256;
/// Default `[subscriptions] retention` (24 hours).
pub const DEFAULT_SUBSCRIPTIONS_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default `[subscriptions] ack_timeout`.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `[subscriptions] max_deliveries`.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
/// Default `[subscriptions] trim_every`.
pub const DEFAULT_TRIM_EVERY: Duration = Duration::from_secs(60);
/// Default `[subscriptions] buffer`.
pub const DEFAULT_SUBSCRIPTIONS_BUFFER: usize = 1024;
/// Default `shutdown_grace`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Most shards `redis.shards` may ask for.
pub const MAX_SHARDS: u16 = 1024;
/// Longest `max_wait` a policy may set (30 days).
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// Largest `limits.max_key_bytes` and `limits.max_item_id_bytes`.
pub const MAX_ID_BYTES_LIMIT: usize = 65_536;
/// Largest `limits.max_payload_bytes` (512 MiB, Redis' own string limit).
pub const MAX_PAYLOAD_BYTES_LIMIT: usize = 512 * 1024 * 1024;

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
    #[serde(deserialize_with = "de_socket_addr")]
    pub listen: SocketAddr,
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
    /// How long a shutdown waits for in-flight requests and subscribers to
    /// drain before it cuts them off.
    #[serde(deserialize_with = "de_duration")]
    pub shutdown_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN,
            redis: RedisConfig::default(),
            defaults: PolicyDefaults::default(),
            keys: BTreeMap::new(),
            limits: Limits::default(),
            dedup: DedupConfig::default(),
            sweeper: SweeperConfig::default(),
            subscriptions: SubscriptionsConfig::default(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// `[redis]`: which Redis to use and how to name keys in it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// URL of an external Redis. `None` starts an embedded redis-server, so
    /// that a single binary can run with no other setup.
    pub url: Option<String>,
    /// Embedded mode only: where the embedded server keeps its AOF/RDB files,
    /// so that state survives restarts.
    pub data_dir: PathBuf,
    /// Prefix of every key, so several deployments can share one Redis. It
    /// becomes part of a `{...}` hash tag, hence no braces or whitespace.
    pub prefix: String,
    /// Number of shards groups are spread over; each shard has its own due
    /// set, stream and sweeper, and maps to one Redis Cluster slot.
    pub shards: u16,
    /// Embedded mode only: the redis-server binary, a path or a name on `PATH`,
    /// for systems where it is installed elsewhere or under another name.
    pub redis_server: PathBuf,
    /// Embedded mode only: the AOF fsync policy. `"always"` (the default)
    /// means an acknowledged item survives a crash; the others trade that for
    /// throughput.
    pub appendfsync: String,
    /// How long to wait for a connection, so startup fails fast on a wrong URL.
    #[serde(deserialize_with = "de_duration")]
    pub connect_timeout: Duration,
    /// How long to wait for one command's reply before the request fails,
    /// so a stalled Redis turns into errors instead of piled-up requests.
    #[serde(deserialize_with = "de_duration")]
    pub response_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            data_dir: PathBuf::from(DEFAULT_REDIS_DATA_DIR),
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            shards: DEFAULT_REDIS_SHARDS,
            redis_server: PathBuf::from(DEFAULT_REDIS_SERVER),
            appendfsync: DEFAULT_APPENDFSYNC.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }
}

/// `[defaults]`: the flush policy of keys that no `[keys."..."]` table sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyDefaults {
    /// Flush when a group reaches this many items: bounds batch size.
    pub max_items: u32,
    /// Flush when the group's first item has waited this long: bounds latency.
    #[serde(deserialize_with = "de_duration")]
    pub max_wait: Duration,
    /// Flush when the group's payload bytes reach this, if set: bounds the
    /// size of a batch message for consumers with a message-size limit.
    #[serde(deserialize_with = "de_opt_bytes")]
    pub max_bytes: Option<u64>,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        PolicyDefaults {
            max_items: DEFAULT_MAX_ITEMS,
            max_wait: DEFAULT_MAX_WAIT,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl PolicyDefaults {
    /// These defaults as a complete policy.
    pub fn policy(&self) -> Policy {
        Policy {
            max_items: self.max_items,
            max_wait: self.max_wait,
            max_bytes: self.max_bytes,
        }
    }
}

/// One `[keys."pattern"]` table: the fields it sets override `[defaults]`
/// for the keys it matches; the fields it leaves unset come from `[defaults]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyPolicy {
    /// Overrides `[defaults] max_items` for matching keys.
    pub max_items: Option<u32>,
    /// Overrides `[defaults] max_wait` for matching keys.
    #[serde(deserialize_with = "de_opt_duration")]
    pub max_wait: Option<Duration>,
    /// Overrides `[defaults] max_bytes` for matching keys.
    #[serde(deserialize_with = "de_opt_bytes")]
    pub max_bytes: Option<u64>,
}

impl KeyPolicy {
    /// This table's fields over `defaults`.
    pub fn over(&self, defaults: Policy) -> Policy {
        Policy {
            max_items: self.max_items.unwrap_or(defaults.max_items),
            max_wait: self.max_wait.unwrap_or(defaults.max_wait),
            max_bytes: self.max_bytes.or(defaults.max_bytes),
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
    #[serde(deserialize_with = "de_usize_bytes")]
    pub max_key_bytes: usize,
    /// Longest item id, in bytes: ids are remembered for the dedup window.
    #[serde(deserialize_with = "de_usize_bytes")]
    pub max_item_id_bytes: usize,
    /// Largest payload of one item, in bytes.
    #[serde(deserialize_with = "de_usize_bytes")]
    pub max_payload_bytes: usize,
    /// Largest `max_items` a policy may set: bounds the size of one flush,
    /// which runs as a single Redis script.
    pub max_items: u32,
    /// Most items in one AddMany call: bounds one request's script run time.
    pub max_add_many: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_item_id_bytes: DEFAULT_MAX_ITEM_ID_BYTES,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_items: DEFAULT_LIMIT_MAX_ITEMS,
            max_add_many: DEFAULT_MAX_ADD_MANY,
        }
    }
}

/// `[dedup]`: suppression of items re-sent after their group was flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DedupConfig {
    /// How long flushed item ids are remembered, so a client retry that
    /// arrives after the flush is not batched a second time.
    #[serde(deserialize_with = "de_duration")]
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
    #[serde(deserialize_with = "de_duration")]
    pub max_sleep: Duration,
    /// Most due groups read per sweep step, so one step's Redis call stays
    /// short even after a long outage left many groups overdue.
    pub batch: usize,
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
    #[serde(deserialize_with = "de_duration")]
    pub retention: Duration,
    /// Per-subscriber queue length: bounds the memory one slow subscriber can
    /// hold. A live subscriber further behind catches up from Redis; a durable
    /// one takes no new batches until it has room.
    pub buffer: usize,
    /// How long a durable subscriber may hold a batch without acking it
    /// before it is redelivered to a live consumer of its group.
    #[serde(deserialize_with = "de_duration")]
    pub ack_timeout: Duration,
    /// After this many deliveries without an ack a batch is dead-lettered,
    /// so one poison batch cannot cycle through a group forever.
    pub max_deliveries: u32,
    /// How often each shard's stream is trimmed to `retention`.
    #[serde(deserialize_with = "de_duration")]
    pub trim_every: Duration,
}

impl Default for SubscriptionsConfig {
    fn default() -> Self {
        SubscriptionsConfig {
            retention: DEFAULT_SUBSCRIPTIONS_RETENTION,
            buffer: DEFAULT_SUBSCRIPTIONS_BUFFER,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            trim_every: DEFAULT_TRIM_EVERY,
        }
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a configuration could not be loaded. Every message names the file and,
/// where there is one, the table and field, on one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("{origin}: TOML syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// The file name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// What the TOML parser said.
        message: String,
    },
    /// A table holds a field this version does not know (often a typo).
    #[error("{origin}: [{table}] {message}{}", at(.location))]
    UnknownField {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The unknown field.
        field: String,
        /// What the deserializer said, including the fields it expected.
        message: String,
        /// 1-based line and column, when known.
        location: Option<(usize, usize)>,
    },
    /// A value has the wrong type or cannot be parsed.
    #[error("{origin}: [{table}] {}{message}{}", field_prefix(.field), at(.location))]
    Value {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The field, if the error is within one.
        field: Option<String>,
        /// What is wrong.
        message: String,
        /// 1-based line and column, when known.
        location: Option<(usize, usize)>,
    },
    /// The file parsed, but a value is out of range or inconsistent.
    #[error("{origin}: [{table}] {field}: {message}")]
    Invalid {
        /// The file name.
        origin: String,
        /// The table, as written in a header: `defaults`, `keys."north"`, `top level`.
        table: String,
        /// The field.
        field: String,
        /// What is wrong, and what is allowed.
        message: String,
    },
}

fn at(location: &Option<(usize, usize)>) -> String {
    match location {
        Some((line, column)) => format!(" (line {line}, column {column})"),
        None => String::new(),
    }
}

fn field_prefix(field: &Option<String>) -> String {
    match field {
        Some(field) => format!("{field}: "),
        None => String::new(),
    }
}

/// The name the messages use for the top-level table.
const TOP_LEVEL: &str = "top level";

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Whether a TOML key can be written bare.
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A key as TOML would write it, quoted if needed (or if `force_quote`).
fn toml_key(key: &str, force_quote: bool) -> String {
    if !force_quote && is_bare_key(key) {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// The table name of the key pattern `pattern`, as in a header.
fn key_table(pattern: &str) -> String {
    format!("keys.{}", toml_key(pattern, true))
}

/// Splits a deserializer path into the table (as in a header) and the field.
fn table_and_field(path: &serde_path_to_error::Path) -> (String, Option<String>) {
    let mut parts: Vec<String> = path
        .iter()
        .map(|segment| match segment {
            serde_path_to_error::Segment::Map { key } => key.clone(),
            serde_path_to_error::Segment::Seq { index } => index.to_string(),
            serde_path_to_error::Segment::Enum { variant } => variant.clone(),
            serde_path_to_error::Segment::Unknown => "?".to_owned(),
        })
        .collect();
    let Some(field) = parts.pop() else {
        return (TOP_LEVEL.to_owned(), None);
    };
    if parts.is_empty() {
        return (TOP_LEVEL.to_owned(), Some(field));
    }
    // The patterns of `[keys."..."]` are always quoted, as they are in the
    // documentation, so that a glob's '*' reads as part of a string.
    let table = parts
        .iter()
        .enumerate()
        .map(|(i, part)| toml_key(part, i == 1 && parts[0] == "keys"))
        .collect::<Vec<_>>()
        .join(".");
    let field_is_pattern = parts.len() == 1 && parts[0] == "keys";
    (table, Some(toml_key(&field, field_is_pattern)))
}

// ---------------------------------------------------------------------------
// Loading and validation
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
        let deserializer = toml::de::Deserializer::parse(text).map_err(|err| {
            let (line, column) = err.span().map_or((1, 1), |s| line_column(text, s.start));
            ConfigError::Syntax {
                origin: origin.to_owned(),
                line,
                column,
                message: one_line(err.message()),
            }
        })?;
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let (table, field) = table_and_field(err.path());
            let inner = err.inner();
            let location = inner.span().map(|s| line_column(text, s.start));
            let message = one_line(inner.message());
            match field {
                Some(field) if message.starts_with("unknown field") => ConfigError::UnknownField {
                    origin: origin.to_owned(),
                    table,
                    field,
                    message,
                    location,
                },
                field => ConfigError::Value {
                    origin: origin.to_owned(),
                    table,
                    field,
                    message,
                    location,
                },
            }
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Checks ranges and consistency; `origin` is the file name for messages.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |table: &str, field: &str, message: String| ConfigError::Invalid {
            origin: origin.to_owned(),
            table: table.to_owned(),
            field: field.to_owned(),
            message,
        };

        // [limits] first: the policy checks depend on it.
        let l = &self.limits;
        for (field, value, max) in [
            ("max_key_bytes", l.max_key_bytes, MAX_ID_BYTES_LIMIT),
            ("max_item_id_bytes", l.max_item_id_bytes, MAX_ID_BYTES_LIMIT),
            (
                "max_payload_bytes",
                l.max_payload_bytes,
                MAX_PAYLOAD_BYTES_LIMIT,
            ),
            ("max_add_many", l.max_add_many, usize::MAX),
        ] {
            if value == 0 || value > max {
                let message = if max == usize::MAX {
                    format!("must be at least 1, got {value}")
                } else {
                    format!("must be between 1 and {max}, got {value}")
                };
                return Err(invalid("limits", field, message));
            }
        }
        if l.max_items == 0 {
            return Err(invalid(
                "limits",
                "max_items",
                "must be at least 1, got 0".to_owned(),
            ));
        }

        // [redis]
        let r = &self.redis;
        if let Some(url) = &r.url {
            const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
            if !SCHEMES.iter().any(|s| url.starts_with(s)) {
                return Err(invalid(
                    "redis",
                    "url",
                    format!(
                        "must start with redis://, rediss://, redis+unix:// or unix:// \
                         (omit it to run the embedded redis-server), got {url:?}"
                    ),
                ));
            }
        }
        if r.data_dir.as_os_str().is_empty() {
            return Err(invalid("redis", "data_dir", "must not be empty".to_owned()));
        }
        if r.prefix.is_empty()
            || r.prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_whitespace())
        {
            return Err(invalid(
                "redis",
                "prefix",
                format!(
                    "must be non-empty and contain no '{{', '}}' or whitespace, got {:?}",
                    r.prefix
                ),
            ));
        }
        if r.shards == 0 || r.shards > MAX_SHARDS {
            return Err(invalid(
                "redis",
                "shards",
                format!("must be between 1 and {MAX_SHARDS}, got {}", r.shards),
            ));
        }
        if r.redis_server.as_os_str().is_empty() {
            return Err(invalid(
                "redis",
                "redis_server",
                "must not be empty".to_owned(),
            ));
        }
        if !APPENDFSYNC_VALUES.contains(&r.appendfsync.as_str()) {
            return Err(invalid(
                "redis",
                "appendfsync",
                format!(
                    "must be \"always\", \"everysec\" or \"no\", got {:?}",
                    r.appendfsync
                ),
            ));
        }
        for (field, value) in [
            ("connect_timeout", r.connect_timeout),
            ("response_timeout", r.response_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid("redis", field, "must be greater than 0".to_owned()));
            }
        }

        // [defaults] and [keys."..."]
        let d = &self.defaults;
        self.validate_policy(
            "defaults",
            Some(d.max_items),
            Some(d.max_wait),
            d.max_bytes,
            &invalid,
        )?;
        for (pattern, policy) in &self.keys {
            let table = key_table(pattern);
            if pattern.is_empty() {
                return Err(invalid(
                    "keys",
                    "\"\"",
                    "a key pattern must not be empty".to_owned(),
                ));
            }
            let literal = pattern.bytes().filter(|&b| b != b'*').count();
            if literal > l.max_key_bytes {
                return Err(invalid(
                    "keys",
                    &toml_key(pattern, true),
                    format!(
                        "can never match: it needs {literal} bytes of key but \
                         keys are at most {} bytes (limits.max_key_bytes)",
                        l.max_key_bytes
                    ),
                ));
            }
            self.validate_policy(
                &table,
                policy.max_items,
                policy.max_wait,
                policy.max_bytes,
                &invalid,
            )?;
        }

        // [dedup], [sweeper], [subscriptions]
        if self.dedup.window.is_zero() {
            return Err(invalid(
                "dedup",
                "window",
                "must be greater than 0".to_owned(),
            ));
        }
        if self.sweeper.max_sleep.is_zero() {
            return Err(invalid(
                "sweeper",
                "max_sleep",
                "must be greater than 0".to_owned(),
            ));
        }
        if self.sweeper.batch == 0 {
            return Err(invalid(
                "sweeper",
                "batch",
                "must be at least 1, got 0".to_owned(),
            ));
        }
        if self.subscriptions.retention.is_zero() {
            return Err(invalid(
                "subscriptions",
                "retention",
                "must be greater than 0".to_owned(),
            ));
        }
        if self.subscriptions.buffer == 0 {
            return Err(invalid(
                "subscriptions",
                "buffer",
                "must be at least 1, got 0".to_owned(),
            ));
        }
        if self.subscriptions.ack_timeout.is_zero() {
            return Err(invalid(
                "subscriptions",
                "ack_timeout",
                "must be greater than 0".to_owned(),
            ));
        }
        if self.subscriptions.max_deliveries == 0 {
            return Err(invalid(
                "subscriptions",
                "max_deliveries",
                "must be at least 1, got 0".to_owned(),
            ));
        }
        if self.subscriptions.trim_every.is_zero() {
            return Err(invalid(
                "subscriptions",
                "trim_every",
                "must be greater than 0".to_owned(),
            ));
        }
        Ok(())
    }

    /// Checks the fields of one policy table that are set.
    fn validate_policy(
        &self,
        table: &str,
        max_items: Option<u32>,
        max_wait: Option<Duration>,
        max_bytes: Option<u64>,
        invalid: &dyn Fn(&str, &str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let limit = self.limits.max_items;
        if let Some(n) = max_items
            && (n == 0 || n > limit)
        {
            return Err(invalid(
                table,
                "max_items",
                format!("must be between 1 and {limit} (limits.max_items), got {n}"),
            ));
        }
        if let Some(wait) = max_wait
            && (wait.is_zero() || wait > MAX_WAIT_LIMIT)
        {
            return Err(invalid(
                table,
                "max_wait",
                format!(
                    "must be greater than 0 and at most {}, got {}",
                    humantime::format_duration(MAX_WAIT_LIMIT),
                    humantime::format_duration(wait)
                ),
            ));
        }
        if max_bytes == Some(0) {
            return Err(invalid(
                table,
                "max_bytes",
                "must be at least 1 when set, got 0".to_owned(),
            ));
        }
        Ok(())
    }

    /// The resolved policy table of this configuration.
    pub fn policies(&self) -> Policies {
        Policies::new(self.defaults.policy(), &self.keys)
    }
}

/// Joins a possibly multi-line message into one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------

/// When a group is flushed: whichever threshold is reached first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Flush when the group holds this many items.
    pub max_items: u32,
    /// Flush when the group's first item has waited this long.
    pub max_wait: Duration,
    /// Flush when the group's payload bytes reach this, if set.
    pub max_bytes: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        PolicyDefaults::default().policy()
    }
}

/// A `*` glob split at its stars, for matching without allocation.
#[derive(Clone, Debug)]
struct Glob {
    /// The pattern as written.
    pattern: String,
    /// Text before the first `*`.
    prefix: String,
    /// Text after the last `*`.
    suffix: String,
    /// Non-empty runs between stars, in order.
    middle: Vec<String>,
    /// The resolved policy.
    policy: Policy,
}

impl Glob {
    /// `pattern` must contain at least one `*`.
    fn new(pattern: &str, policy: Policy) -> Glob {
        let mut parts: Vec<&str> = pattern.split('*').collect();
        debug_assert!(parts.len() >= 2, "a glob has at least one '*'");
        let suffix = parts.pop().unwrap_or_default().to_owned();
        let prefix = parts.first().copied().unwrap_or_default().to_owned();
        let middle = parts
            .iter()
            .skip(1)
            .filter(|p| !p.is_empty())
            .map(|p| (*p).to_owned())
            .collect();
        Glob {
            pattern: pattern.to_owned(),
            prefix,
            suffix,
            middle,
            policy,
        }
    }

    fn matches(&self, key: &str) -> bool {
        if key.len() < self.prefix.len() + self.suffix.len()
            || !key.starts_with(&self.prefix)
            || !key.ends_with(&self.suffix)
        {
            return false;
        }
        // Both ends are char boundaries: they end `prefix` and start `suffix`.
        let mut rest = &key[self.prefix.len()..key.len() - self.suffix.len()];
        // Leftmost matching of each run leaves the most room for the next.
        for run in &self.middle {
            match rest.find(run.as_str()) {
                Some(i) => rest = &rest[i + run.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Whether `key` matches the `*` glob `pattern` (`*` matches any run of
/// characters, including none; nothing else is special).
pub fn glob_matches(pattern: &str, key: &str) -> bool {
    if pattern.contains('*') {
        Glob::new(pattern, Policy::default()).matches(key)
    } else {
        pattern == key
    }
}

/// The resolved policy table: every `[keys."..."]` table merged over
/// `[defaults]` once, so that [`Policies::resolve`] only looks things up.
#[derive(Clone, Debug)]
pub struct Policies {
    defaults: Policy,
    exact: HashMap<String, Policy>,
    /// Longest pattern first, ties by pattern string order.
    globs: Vec<Glob>,
}

impl Default for Policies {
    fn default() -> Self {
        Policies::new(Policy::default(), &BTreeMap::new())
    }
}

impl Policies {
    /// The table for `defaults` and the per-key `keys` tables.
    pub fn new(defaults: Policy, keys: &BTreeMap<String, KeyPolicy>) -> Policies {
        let mut exact = HashMap::new();
        let mut globs = Vec::new();
        for (pattern, key_policy) in keys {
            let policy = key_policy.over(defaults);
            if pattern.contains('*') {
                globs.push(Glob::new(pattern, policy));
            } else {
                exact.insert(pattern.clone(), policy);
            }
        }
        globs.sort_by(|a, b| {
            b.pattern
                .len()
                .cmp(&a.pattern.len())
                .then_with(|| a.pattern.cmp(&b.pattern))
        });
        Policies {
            defaults,
            exact,
            globs,
        }
    }

    /// The policy for a key: an exact key beats a glob, a longer glob beats a
    /// shorter one (ties broken by pattern string order, so the result is
    /// deterministic). Fields a matching table leaves unset come from
    /// `[defaults]`.
    pub fn resolve(&self, key: &str) -> Policy {
        if let Some(policy) = self.exact.get(key) {
            return *policy;
        }
        self.globs
            .iter()
            .find(|glob| glob.matches(key))
            .map_or(self.defaults, |glob| glob.policy)
    }

    /// The pattern that decides `key`'s policy, or `None` for `[defaults]`.
    pub fn matching_pattern(&self, key: &str) -> Option<&str> {
        if let Some((pattern, _)) = self.exact.get_key_value(key) {
            return Some(pattern);
        }
        self.globs
            .iter()
            .find(|glob| glob.matches(key))
            .map(|glob| glob.pattern.as_str())
    }

    /// The `[defaults]` policy.
    pub fn defaults(&self) -> Policy {
        self.defaults
    }
}

/// Live, reloadable policies shared by all tasks. Readers never block; a
/// reload swaps the whole table at once, so a reader sees the old table or
/// the new one, never a mix.
#[derive(Clone)]
pub struct PolicyHandle(Arc<ArcSwap<Policies>>);

impl PolicyHandle {
    /// A handle holding `p`.
    pub fn new(p: Policies) -> Self {
        PolicyHandle(Arc::new(ArcSwap::from_pointee(p)))
    }

    /// The current table.
    pub fn current(&self) -> Arc<Policies> {
        self.0.load_full()
    }

    /// Replaces the table for every holder of this handle (and its clones).
    pub fn replace(&self, p: Policies) {
        self.0.store(Arc::new(p));
    }

    /// The current policy for `key`, without cloning the table.
    pub fn resolve(&self, key: &str) -> Policy {
        self.0.load().resolve(key)
    }
}

impl fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyHandle")
            .field(&*self.0.load())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Value parsers
// ---------------------------------------------------------------------------

/// Parses a byte size: an integer (`"1024"`), or an integer and a unit: `B`,
/// `KB`/`MB`/`GB`/`TB` (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers
/// of 1024). Units are case-insensitive; a space may separate them.
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "invalid size {text:?}: expected an integer and an optional unit, like \"64KiB\""
        ));
    }
    let multiplier: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1000u64.pow(2),
        "gb" => 1000u64.pow(3),
        "tb" => 1000u64.pow(4),
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
                unit.trim_start()
            ));
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

/// A humantime duration string.
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"4m\" or \"250ms\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(v)
                    .map(HumanDuration)
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A byte size: an integer or a size string.
struct ByteSize(u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size: an integer or a string like \"64KiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_byte_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    HumanDuration::deserialize(d).map(|h| h.0)
}

fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Option::<HumanDuration>::deserialize(d).map(|o| o.map(|h| h.0))
}

fn de_opt_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<ByteSize>::deserialize(d).map(|o| o.map(|b| b.0))
}

fn de_usize_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let ByteSize(n) = ByteSize::deserialize(d)?;
    usize::try_from(n).map_err(|_| de::Error::custom(format!("invalid size {n}: too large")))
}

fn de_socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = SocketAddr;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an IP address and port like \"127.0.0.1:50051\"")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<SocketAddr, E> {
            v.parse().map_err(|_| {
                E::custom(format!(
                    "invalid address {v:?}: expected an IP address and port like \
                     \"127.0.0.1:50051\" or \"[::1]:50051\""
                ))
            })
        }
    }
    d.deserialize_str(V)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
listen = "127.0.0.1:50051"

[redis]
url = "redis://127.0.0.1:6379"   # omit to run the embedded redis-server
data_dir = "./data"              # embedded mode only
prefix = "batcher"
shards = 16

[defaults]
max_items = 10                   # flush when a group reaches this many items
max_wait = "4m"                  # flush when the first item has waited this long
# max_bytes = "1MiB"             # optional: flush when the payload bytes reach this

[keys."north"]                   # an exact key
max_items = 25
max_wait = "2m"

[keys."south-*"]                 # a glob: '*' matches any run of characters
max_wait = "30s"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "batcher.toml")
    }

    fn err(text: &str) -> String {
        parse(text)
            .expect_err("config should be rejected")
            .to_string()
    }

    fn policy(max_items: u32, max_wait: &str, max_bytes: Option<u64>) -> Policy {
        Policy {
            max_items,
            max_wait: humantime::parse_duration(max_wait).unwrap(),
            max_bytes,
        }
    }

    /// The documented example parses to the values it spells out.
    #[test]
    fn example_parses() {
        let c = parse(EXAMPLE).unwrap();
        assert_eq!(c.listen, "127.0.0.1:50051".parse::<SocketAddr>().unwrap());
        assert_eq!(c.redis.url.as_deref(), Some("redis://127.0.0.1:6379"));
        assert_eq!(c.redis.data_dir, PathBuf::from("./data"));
        assert_eq!(c.redis.prefix, "batcher");
        assert_eq!(c.redis.shards, 16);
        assert_eq!(c.defaults.max_items, 10);
        assert_eq!(c.defaults.max_wait, Duration::from_secs(240));
        assert_eq!(c.defaults.max_bytes, None);
        assert_eq!(c.keys.len(), 2);
        assert_eq!(c.keys["north"].max_items, Some(25));
        assert_eq!(c.keys["north"].max_wait, Some(Duration::from_secs(120)));
        assert_eq!(c.keys["south-*"].max_items, None);
        assert_eq!(c.keys["south-*"].max_wait, Some(Duration::from_secs(30)));
        let p = c.policies();
        assert_eq!(p.resolve("north"), policy(25, "2m", None));
        assert_eq!(p.resolve("south-1"), policy(10, "30s", None));
        assert_eq!(p.resolve("east"), policy(10, "4m", None));
        // Everything not in the file is at its default.
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    }

    /// An empty file is exactly `Config::default()`, with the documented values.
    #[test]
    fn empty_is_default() {
        let c = parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(c.redis.url, None);
        assert_eq!(c.redis.appendfsync, "always");
        assert_eq!(c.redis.redis_server, PathBuf::from("redis-server"));
        assert_eq!(c.redis.connect_timeout, Duration::from_secs(1));
        assert_eq!(c.redis.response_timeout, Duration::from_secs(2));
        assert_eq!(c.limits.max_payload_bytes, 65536);
        assert_eq!(c.dedup.window, Duration::from_secs(600));
        assert_eq!(c.sweeper.max_sleep, Duration::from_millis(250));
        assert_eq!(c.subscriptions.retention, Duration::from_secs(86400));
        // Empty tables are no different from missing ones.
        let tables = "[redis]\n[defaults]\n[keys]\n[limits]\n[dedup]\n[sweeper]\n[subscriptions]\n";
        assert_eq!(parse(tables).unwrap(), Config::default());
        Config::default().validate("default").unwrap();
    }

    /// Every optional table and field is read from the file when present.
    #[test]
    fn all_fields_parse() {
        let c = parse(
            r#"
shutdown_grace = "3s"
[redis]
redis_server = "/opt/redis/bin/redis-server"
appendfsync = "everysec"
connect_timeout = "500ms"
response_timeout = "5s"
[defaults]
max_bytes = "1MiB"
[limits]
max_key_bytes = 128
max_item_id_bytes = "1KiB"
max_payload_bytes = "64KiB"
max_items = 500
max_add_many = 50
[dedup]
window = "1h"
[sweeper]
max_sleep = "1s"
batch = 8
[subscriptions]
retention = "2h"
buffer = 16
"#,
        )
        .unwrap();
        assert_eq!(c.shutdown_grace, Duration::from_secs(3));
        assert_eq!(
            c.redis.redis_server,
            PathBuf::from("/opt/redis/bin/redis-server")
        );
        assert_eq!(c.redis.appendfsync, "everysec");
        assert_eq!(c.redis.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.redis.response_timeout, Duration::from_secs(5));
        assert_eq!(c.defaults.max_bytes, Some(1 << 20));
        assert_eq!(
            c.limits,
            Limits {
                max_key_bytes: 128,
                max_item_id_bytes: 1024,
                max_payload_bytes: 65536,
                max_items: 500,
                max_add_many: 50,
            }
        );
        assert_eq!(c.dedup.window, Duration::from_secs(3600));
        assert_eq!(c.sweeper.max_sleep, Duration::from_secs(1));
        assert_eq!(c.sweeper.batch, 8);
        assert_eq!(c.subscriptions.retention, Duration::from_secs(7200));
        assert_eq!(c.subscriptions.buffer, 16);
    }

    /// An exact key's table beats any glob that also matches it.
    #[test]
    fn exact_beats_glob() {
        let c = parse(
            r#"
[keys."north-1"]
max_items = 5
[keys."north-*"]
max_items = 6
[keys."*"]
max_items = 7
"#,
        )
        .unwrap();
        let p = c.policies();
        assert_eq!(p.resolve("north-1").max_items, 5);
        assert_eq!(p.matching_pattern("north-1"), Some("north-1"));
        assert_eq!(p.resolve("north-2").max_items, 6);
        assert_eq!(p.resolve("other").max_items, 7);
    }

    /// A longer glob beats a shorter one, and equal lengths tie-break by pattern order.
    #[test]
    fn longer_glob_beats_shorter() {
        let c = parse(
            r#"
[keys."s*"]
max_items = 1
[keys."south-*"]
max_items = 2
[keys."*-eu"]
max_items = 3
[keys."*uth-eu"]
max_items = 4
"#,
        )
        .unwrap();
        let p = c.policies();
        assert_eq!(p.resolve("south-1").max_items, 2);
        assert_eq!(p.resolve("sea").max_items, 1);
        assert_eq!(p.resolve("x-eu").max_items, 3);
        // "south-eu" matches all four; "south-*" and "*uth-eu" are both 7 bytes
        // long, and "*uth-eu" sorts first.
        assert_eq!(p.resolve("south-eu").max_items, 4);
        assert_eq!(p.matching_pattern("south-eu"), Some("*uth-eu"));
        assert_eq!(p.matching_pattern("east"), None);
    }

    /// Fields a matching table leaves unset come from [defaults], not from a losing glob.
    #[test]
    fn unset_fields_come_from_defaults() {
        let c = parse(
            r#"
[defaults]
max_items = 11
max_wait = "1m"
max_bytes = "10KB"
[keys."a*"]
max_items = 3
max_wait = "5s"
max_bytes = 99
[keys."ab*"]
max_wait = "7s"
"#,
        )
        .unwrap();
        let p = c.policies();
        assert_eq!(p.resolve("abc"), policy(11, "7s", Some(10_000)));
        assert_eq!(p.resolve("axe"), policy(3, "5s", Some(99)));
        assert_eq!(p.resolve("zzz"), policy(11, "1m", Some(10_000)));
        assert_eq!(p.defaults(), policy(11, "1m", Some(10_000)));
    }

    /// An unknown field's error names the file, the table and the field.
    #[test]
    fn unknown_field_names_file_table_field() {
        let e = parse("[keys.\"north\"]\nmax_itemz = 3\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("batcher.toml: [keys.\"north\"] unknown field `max_itemz`"),
            "{msg}"
        );
        assert!(msg.contains("line 2"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        match e {
            ConfigError::UnknownField { table, field, .. } => {
                assert_eq!(table, "keys.\"north\"");
                assert_eq!(field, "max_itemz");
            }
            other => panic!("wrong variant: {other:?}"),
        }
        let msg = err("[redis]\nshard = 3\n");
        assert!(
            msg.starts_with("batcher.toml: [redis] unknown field `shard`"),
            "{msg}"
        );
        let msg = err("lisen = \"1.2.3.4:5\"\n");
        assert!(
            msg.starts_with("batcher.toml: [top level] unknown field `lisen`"),
            "{msg}"
        );
        let msg = err("[dedupe]\n");
        assert!(
            msg.starts_with("batcher.toml: [top level] unknown field `dedupe`"),
            "{msg}"
        );
    }

    /// `max_items = 0` is rejected with the file, table, field, range and value.
    #[test]
    fn zero_max_items_names_file_table_field() {
        let msg = err("[keys.\"north\"]\nmax_items = 0\n");
        assert_eq!(
            msg,
            "batcher.toml: [keys.\"north\"] max_items: must be between 1 and 10000 \
             (limits.max_items), got 0"
        );
        let msg = err("[defaults]\nmax_items = 0\n");
        assert!(
            msg.starts_with("batcher.toml: [defaults] max_items: must be between 1"),
            "{msg}"
        );
        // The bound follows [limits].
        let msg = err("[limits]\nmax_items = 20\n[keys.\"x*\"]\nmax_items = 21\n");
        assert!(
            msg.contains(
                "[keys.\"x*\"] max_items: must be between 1 and 20 (limits.max_items), got 21"
            ),
            "{msg}"
        );
    }

    /// A bad duration names the table and field and quotes the bad value.
    #[test]
    fn bad_duration() {
        let msg = err("[defaults]\nmax_wait = \"4 parsecs\"\n");
        assert!(
            msg.starts_with("batcher.toml: [defaults] max_wait: invalid duration \"4 parsecs\": "),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        let msg = err("[sweeper]\nmax_sleep = 5\n");
        assert!(
            msg.starts_with("batcher.toml: [sweeper] max_sleep: invalid type"),
            "{msg}"
        );
        let msg = err("[keys.\"a\"]\nmax_wait = \"0s\"\n");
        assert!(
            msg.starts_with("batcher.toml: [keys.\"a\"] max_wait: must be greater than 0"),
            "{msg}"
        );
        let msg = err("[defaults]\nmax_wait = \"31days\"\n");
        assert!(
            msg.contains("[defaults] max_wait: must be greater than 0 and at most 30days"),
            "{msg}"
        );
        let msg = err("shutdown_grace = \"soon\"\n");
        assert!(
            msg.starts_with("batcher.toml: [top level] shutdown_grace: invalid duration"),
            "{msg}"
        );
    }

    /// Byte sizes accept integers and the documented unit strings.
    #[test]
    fn size_strings_parse() {
        for (text, bytes) in [
            ("1024", 1024),
            ("512B", 512),
            ("64KiB", 65536),
            ("1MiB", 1 << 20),
            ("1GiB", 1 << 30),
            ("10KB", 10_000),
            ("10MB", 10_000_000),
            ("2 kib", 2048),
            ("0", 0),
        ] {
            assert_eq!(parse_byte_size(text), Ok(bytes), "{text}");
        }
        for bad in [
            "",
            "MiB",
            "1.5MiB",
            "-1",
            "10 parsecs",
            "99999999999999999999",
            "20000000TiB",
        ] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
        let c = parse("[defaults]\nmax_bytes = \"1MiB\"\n[limits]\nmax_payload_bytes = 4096\n")
            .unwrap();
        assert_eq!(c.defaults.max_bytes, Some(1 << 20));
        assert_eq!(c.limits.max_payload_bytes, 4096);
        let msg = err("[limits]\nmax_payload_bytes = \"64 furlongs\"\n");
        assert!(
            msg.starts_with(
                "batcher.toml: [limits] max_payload_bytes: invalid size \"64 furlongs\""
            ),
            "{msg}"
        );
        let msg = err("[limits]\nmax_payload_bytes = \"1GiB\"\n");
        assert!(
            msg.contains("[limits] max_payload_bytes: must be between 1 and 536870912"),
            "{msg}"
        );
        let msg = err("[defaults]\nmax_bytes = 0\n");
        assert!(
            msg.contains("[defaults] max_bytes: must be at least 1 when set, got 0"),
            "{msg}"
        );
        let msg = err("[defaults]\nmax_bytes = -5\n");
        assert!(
            msg.contains("[defaults] max_bytes: invalid size -5: must not be negative"),
            "{msg}"
        );
    }

    /// `*` matches any run of characters, including none, anywhere in the pattern.
    #[test]
    fn glob_edge_cases() {
        let cases: &[(&str, &str, bool)] = &[
            // prefix
            ("south-*", "south-1", true),
            ("south-*", "south-", true),
            ("south-*", "south", false),
            ("south-*", "xsouth-1", false),
            // suffix
            ("*-eu", "north-eu", true),
            ("*-eu", "-eu", true),
            ("*-eu", "north-eux", false),
            // middle
            ("a*z", "az", true),
            ("a*z", "abcz", true),
            ("a*z", "abc", false),
            ("a*z", "z", false),
            ("aa*aa", "aaa", false),
            ("aa*aa", "aaaa", true),
            // multiple stars
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-c", true),
            ("a*b*c", "a-c-b", false),
            ("*a*b*", "xaybz", true),
            ("*a*b*", "ba", false),
            ("a**b", "ab", true),
            ("*ab*ab*", "abab", true),
            ("*ab*ab*", "aba", false),
            // lone star and empty key
            ("*", "", true),
            ("*", "anything", true),
            ("**", "", true),
            ("a*", "", false),
            // no star: exact, and other glob characters are literal
            ("north", "north", true),
            ("north", "north1", false),
            ("n?rth", "north", false),
            ("[ab]*", "[ab]x", true),
            // multi-byte characters
            ("é*ü", "éxyzü", true),
            ("*ü", "ü", true),
        ];
        for &(pattern, key, want) in cases {
            assert_eq!(glob_matches(pattern, key), want, "{pattern:?} vs {key:?}");
        }
    }

    /// Other invalid values are rejected with the table and field named.
    #[test]
    fn other_validation_errors() {
        for (text, want) in [
            (
                "listen = \"localhost\"\n",
                "batcher.toml: [top level] listen: invalid address \"localhost\"",
            ),
            (
                "[redis]\nshards = 0\n",
                "batcher.toml: [redis] shards: must be between 1 and 1024, got 0",
            ),
            (
                "[redis]\nshards = 1025\n",
                "[redis] shards: must be between 1 and 1024",
            ),
            (
                "[redis]\nprefix = \"\"\n",
                "batcher.toml: [redis] prefix: must be non-empty",
            ),
            (
                "[redis]\nprefix = \"a{b\"\n",
                "[redis] prefix: must be non-empty and contain no",
            ),
            (
                "[redis]\nprefix = \"a b\"\n",
                "[redis] prefix: must be non-empty and contain no",
            ),
            (
                "[redis]\nappendfsync = \"sometimes\"\n",
                "[redis] appendfsync: must be",
            ),
            (
                "[redis]\nurl = \"localhost:6379\"\n",
                "[redis] url: must start with redis://",
            ),
            (
                "[redis]\nconnect_timeout = \"0s\"\n",
                "[redis] connect_timeout: must be greater than 0",
            ),
            (
                "[limits]\nmax_key_bytes = 0\n",
                "[limits] max_key_bytes: must be between 1 and 65536, got 0",
            ),
            (
                "[limits]\nmax_item_id_bytes = 65537\n",
                "[limits] max_item_id_bytes: must be between 1 and 65536",
            ),
            (
                "[limits]\nmax_add_many = 0\n",
                "[limits] max_add_many: must be at least 1, got 0",
            ),
            (
                "[limits]\nmax_items = 0\n",
                "[limits] max_items: must be at least 1, got 0",
            ),
            (
                "[keys.\"\"]\n",
                "batcher.toml: [keys] \"\": a key pattern must not be empty",
            ),
            (
                "[limits]\nmax_key_bytes = 3\n[keys.\"abcd*\"]\n",
                "[keys] \"abcd*\": can never match",
            ),
            (
                "[dedup]\nwindow = \"0s\"\n",
                "[dedup] window: must be greater than 0",
            ),
            (
                "[sweeper]\nmax_sleep = \"0s\"\n",
                "[sweeper] max_sleep: must be greater than 0",
            ),
            (
                "[sweeper]\nbatch = 0\n",
                "[sweeper] batch: must be at least 1, got 0",
            ),
            (
                "[subscriptions]\nbuffer = 0\n",
                "[subscriptions] buffer: must be at least 1, got 0",
            ),
            (
                "[redis]\nshards = \"many\"\n",
                "batcher.toml: [redis] shards: invalid type: string \"many\"",
            ),
            (
                "[redis]\nshards = -1\n",
                "batcher.toml: [redis] shards: invalid value",
            ),
            (
                "redis = 5\n",
                "batcher.toml: [top level] redis: invalid type",
            ),
            (
                "[keys]\nnorth = 5\n",
                "batcher.toml: [keys] \"north\": invalid type",
            ),
        ] {
            let msg = err(text);
            assert!(msg.contains(want), "{text:?}: got {msg:?}, want {want:?}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    /// A TOML syntax error names the file and the line, on one line.
    #[test]
    fn syntax_error() {
        let e = parse("[defaults]\nmax_items = = 3\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("batcher.toml: TOML syntax error at line 2"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
    }

    /// `load` reads a file, and names it when it cannot.
    #[test]
    fn load_reads_file() {
        let dir = std::env::temp_dir().join(format!("batcher-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("batcher.toml");
        std::fs::write(&path, EXAMPLE).unwrap();
        assert_eq!(Config::load(&path).unwrap(), parse(EXAMPLE).unwrap());
        std::fs::write(&path, "[defaults]\nmax_items = 0\n").unwrap();
        let msg = Config::load(&path).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("{}: [defaults] max_items", path.display())),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let missing = dir.join("missing.toml");
        let msg = Config::load(&missing).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("{}: cannot read config file", missing.display())),
            "{msg}"
        );
    }

    /// A PolicyHandle's replacement is seen through every clone.
    #[test]
    fn policy_handle_replace() {
        let handle = PolicyHandle::new(Policies::default());
        let other = handle.clone();
        assert_eq!(other.resolve("north"), Policy::default());
        let c = parse(EXAMPLE).unwrap();
        handle.replace(c.policies());
        assert_eq!(other.resolve("north").max_items, 25);
        assert_eq!(
            other.current().resolve("south-x").max_wait,
            Duration::from_secs(30)
        );
    }
}
