//! The rules of a configuration that no field's type expresses: bounds
//! (a shard count, a longest wait, byte limits), the shape of strings (a key
//! prefix, a Redis URL), durations that must not be zero, and the rules
//! that relate fields to each other (a policy's `max_items` against
//! `[limits] max_items`, a key pattern against `[limits] max_key_bytes`).
//!
//! Each rule is one `ensure` call, most of them driven by a small table of
//! fields; the first broken rule is returned as a [`Violation`] that names
//! the path to the field, and `error` turns it into a message with a line.

use std::num::NonZeroU32;
use std::time::Duration;

use bytesize::ByteSize;

use super::{
    Config, Limits, MAX_ID_BYTES_LIMIT, MAX_PAYLOAD_BYTES_LIMIT, MAX_SHARDS, MAX_WAIT_LIMIT,
    RedisConfig,
};

/// The URL schemes the redis crate connects with.
const REDIS_SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];

/// A rule the configuration breaks: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", path.join("."))]
pub struct Violation {
    /// The keys from the top of the file to the field, as in
    /// `["keys", "north", "max_items"]`; for a key pattern itself,
    /// `["keys", pattern]`.
    pub path: Vec<String>,
    /// What is wrong, and what is allowed.
    pub message: String,
}

/// `Ok` if `ok`, else a violation at `table`'s `field` saying `message()`.
fn ensure(
    ok: bool,
    table: &[&str],
    field: &str,
    message: impl FnOnce() -> String,
) -> Result<(), Violation> {
    if ok {
        return Ok(());
    }
    let path = table.iter().chain([&field]).map(|s| (*s).to_owned());
    Err(Violation {
        path: path.collect(),
        message: message(),
    })
}

/// Checks every rule; the first one broken is the error.
pub(super) fn check(config: &Config) -> Result<(), Violation> {
    limits(&config.limits)?;
    redis(&config.redis)?;
    durations(config)?;
    policies(config)
}

/// `[limits]` byte fields are within what Redis and the key layout allow.
fn limits(l: &Limits) -> Result<(), Violation> {
    for (field, value, max) in [
        ("max_key_bytes", l.max_key_bytes, MAX_ID_BYTES_LIMIT),
        ("max_item_id_bytes", l.max_item_id_bytes, MAX_ID_BYTES_LIMIT),
        (
            "max_payload_bytes",
            l.max_payload_bytes,
            MAX_PAYLOAD_BYTES_LIMIT,
        ),
    ] {
        let n = value.as_u64();
        ensure((1..=max).contains(&n), &["limits"], field, || {
            format!("must be between 1 and {max}, got {n}")
        })?;
    }
    Ok(())
}

/// `[redis]`: a URL the client can use, non-empty paths, a prefix that fits
/// in a hash tag, and a bounded shard count.
fn redis(r: &RedisConfig) -> Result<(), Violation> {
    if let Some(url) = &r.url {
        ensure(
            REDIS_SCHEMES.iter().any(|s| url.starts_with(s)),
            &["redis"],
            "url",
            || {
                format!(
                    "must start with redis://, rediss://, redis+unix:// or unix:// \
                     (omit it to run the embedded redis-server), got {url:?}"
                )
            },
        )?;
    }
    for (field, path) in [("data_dir", &r.data_dir), ("redis_server", &r.redis_server)] {
        ensure(!path.as_os_str().is_empty(), &["redis"], field, || {
            "must not be empty".to_owned()
        })?;
    }
    let prefix_ok = !r.prefix.is_empty()
        && !r
            .prefix
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_whitespace());
    ensure(prefix_ok, &["redis"], "prefix", || {
        format!(
            "must be non-empty and contain no '{{', '}}' or whitespace, got {:?}",
            r.prefix
        )
    })?;
    ensure(r.shards.get() <= MAX_SHARDS, &["redis"], "shards", || {
        format!("must be between 1 and {MAX_SHARDS}, got {}", r.shards)
    })
}

/// Timeouts, windows and periods that would break their loop at zero.
fn durations(c: &Config) -> Result<(), Violation> {
    let s = &c.subscriptions;
    for (table, field, value) in [
        ("redis", "connect_timeout", c.redis.connect_timeout),
        ("redis", "response_timeout", c.redis.response_timeout),
        ("dedup", "window", c.dedup.window),
        ("sweeper", "max_sleep", c.sweeper.max_sleep),
        ("subscriptions", "retention", s.retention),
        ("subscriptions", "ack_timeout", s.ack_timeout),
        ("subscriptions", "trim_every", s.trim_every),
    ] {
        ensure(!value.is_zero(), &[table], field, || {
            "must be greater than 0".to_owned()
        })?;
    }
    Ok(())
}

/// `[defaults]` and every `[keys."..."]` table, and the patterns themselves.
fn policies(c: &Config) -> Result<(), Violation> {
    let d = &c.defaults;
    let defaults = PolicyFields {
        max_items: Some(d.max_items),
        max_wait: Some(d.max_wait),
        max_bytes: d.max_bytes,
    };
    defaults.check(c, &["defaults"])?;
    let max_key_bytes = c.limits.max_key_bytes.as_u64();
    for (pattern, table) in &c.keys {
        ensure(!pattern.is_empty(), &["keys"], pattern, || {
            "a key pattern must not be empty".to_owned()
        })?;
        let literal = pattern.bytes().filter(|&b| b != b'*').count() as u64;
        ensure(literal <= max_key_bytes, &["keys"], pattern, || {
            format!(
                "can never match: it needs {literal} bytes of key but \
                 keys are at most {max_key_bytes} bytes (limits.max_key_bytes)"
            )
        })?;
        let fields = PolicyFields {
            max_items: table.max_items,
            max_wait: table.max_wait,
            max_bytes: table.max_bytes,
        };
        fields.check(c, &["keys", pattern])?;
    }
    Ok(())
}

/// The fields of one policy table that are set.
struct PolicyFields {
    max_items: Option<NonZeroU32>,
    max_wait: Option<Duration>,
    max_bytes: Option<ByteSize>,
}

impl PolicyFields {
    /// Checks the set fields against `[limits]` and their bounds.
    fn check(&self, c: &Config, table: &[&str]) -> Result<(), Violation> {
        let limit = c.limits.max_items;
        if let Some(n) = self.max_items {
            ensure(n <= limit, table, "max_items", || {
                format!("must be between 1 and {limit} (limits.max_items), got {n}")
            })?;
        }
        if let Some(wait) = self.max_wait {
            ensure(
                !wait.is_zero() && wait <= MAX_WAIT_LIMIT,
                table,
                "max_wait",
                || {
                    format!(
                        "must be greater than 0 and at most {}, got {}",
                        humantime::format_duration(MAX_WAIT_LIMIT),
                        humantime::format_duration(wait)
                    )
                },
            )?;
        }
        if let Some(bytes) = self.max_bytes {
            ensure(bytes.as_u64() > 0, table, "max_bytes", || {
                "must be at least 1 when set, got 0".to_owned()
            })?;
        }
        Ok(())
    }
}
