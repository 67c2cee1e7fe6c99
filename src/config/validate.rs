//! The rules of a configuration that no field's type expresses: bounds
//! (a shard count, a longest wait, byte limits), the shape of strings (a key
//! prefix, a Redis URL, cluster seed nodes that agree on credentials and
//! TLS, a CA file only for `rediss://`), durations that must not be zero, a
//! policy's capacity (measure names, values up to 2^53 - 1), and the rules
//! that relate fields to each other (a policy's `max_items` against
//! `[limits] max_items`, a key pattern against `[limits] max_key_bytes`, and
//! on each policy table merged over `[defaults]`: `min_items` with `max_age`
//! and `max_items`, `max_age` with `max_wait`).
//!
//! `max_groups` and `overflow` need no rule: any `max_groups` is a limit
//! (0: none), and an `overflow` in a table without one still says what an
//! add past `[limits] max_open_groups` does. That limit is each instance's
//! own, so a rule tying the two would pass a policy of the policy store on
//! one instance and fail it on another.
//!
//! Each rule is one `ensure` call, most of them driven by a small table of
//! fields; the first broken rule is returned as a [`Violation`] that names
//! the path to the field, and `error` turns it into a message with a line.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use bytesize::ByteSize;

use super::{
    Config, KeyPolicy, Limits, MAX_ID_BYTES_LIMIT, MAX_PAYLOAD_BYTES_LIMIT, MAX_SHARDS,
    MAX_WAIT_LIMIT, MAX_WORKER_THREADS, PolicyDefaults, RedisConfig,
};
use crate::policy::{MAX_CAPACITY_MEASURES, MAX_MEASURE, measure_name_ok};

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

/// Checks every rule but the guard-rail tables' (`guard::check`); the
/// first one broken is the error.
pub(super) fn check(config: &Config) -> Result<(), Violation> {
    let threads = config.worker_threads();
    ensure(
        threads.get() <= MAX_WORKER_THREADS,
        &[],
        "worker_threads",
        || format!("must be from 1 to {MAX_WORKER_THREADS}, got {threads}"),
    )?;
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

/// `[redis]`: one way to reach Redis (an embedded server, `url` or
/// `cluster_nodes`) with only the settings that way uses, URLs the client can
/// use, non-empty paths, a prefix that fits in a hash tag, and a bounded
/// shard count.
fn redis(r: &RedisConfig) -> Result<(), Violation> {
    topology(r)?;
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
    for node in &r.cluster_nodes {
        ensure(
            ["redis://", "rediss://"]
                .iter()
                .any(|s| node.starts_with(s)),
            &["redis"],
            "cluster_nodes",
            || format!("each node must start with redis:// or rediss://, got {node:?}"),
        )?;
    }
    cluster_credentials(&r.cluster_nodes)?;
    tls_ca_file(r)?;
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

/// Every seed node carries the same user, password and scheme: the cluster
/// client authenticates to every node, the discovered ones too, with one set
/// of credentials and one TLS mode (redis-rs takes the first node's). The
/// messages name nodes by index, never echo a password.
fn cluster_credentials(nodes: &[String]) -> Result<(), Violation> {
    let mut first = None;
    for (i, node) in nodes.iter().enumerate() {
        let info = redis::IntoConnectionInfo::into_connection_info(node.as_str());
        let info = info.map_err(|e| Violation {
            path: vec!["redis".to_owned(), "cluster_nodes".to_owned()],
            message: format!("node {i} is not a valid Redis URL: {e}"),
        })?;
        let settings = info.redis_settings();
        let auth = (
            node.starts_with("rediss://"),
            settings.username().map(str::to_owned),
            settings.password().map(str::to_owned),
        );
        let first = first.get_or_insert_with(|| auth.clone());
        ensure(first.0 == auth.0, &["redis"], "cluster_nodes", || {
            format!("node {i} and node 0 differ in scheme: use rediss:// on every node or on none")
        })?;
        ensure(
            first.1 == auth.1 && first.2 == auth.2,
            &["redis"],
            "cluster_nodes",
            || {
                format!(
                    "node {i} and node 0 differ in user or password: every node must carry the \
                 same credentials (the client uses one set for the whole cluster)"
                )
            },
        )?;
    }
    Ok(())
}

/// `tls_ca_file` is a path, and only where a `rediss://` URL uses it.
fn tls_ca_file(r: &RedisConfig) -> Result<(), Violation> {
    let Some(path) = &r.tls_ca_file else {
        return Ok(());
    };
    ensure(
        !path.as_os_str().is_empty(),
        &["redis"],
        "tls_ca_file",
        || "must not be empty when set".to_owned(),
    )?;
    let tls = r
        .url
        .iter()
        .chain(&r.cluster_nodes)
        .any(|u| u.starts_with("rediss://"));
    ensure(tls, &["redis"], "tls_ca_file", || {
        "applies only to TLS: needs a rediss:// url or rediss:// cluster_nodes".to_owned()
    })
}

/// `url` and `cluster_nodes` exclude each other; the embedded-only settings
/// need neither, and `wait_replicas` needs one (an embedded server has no
/// replicas).
fn topology(r: &RedisConfig) -> Result<(), Violation> {
    let external = if r.url.is_some() {
        Some("url")
    } else if !r.cluster_nodes.is_empty() {
        Some("cluster_nodes")
    } else {
        None
    };
    ensure(
        r.url.is_none() || r.cluster_nodes.is_empty(),
        &["redis"],
        "cluster_nodes",
        || "cannot be given together with url: name one Redis or one cluster".to_owned(),
    )?;
    let defaults = RedisConfig::default();
    for (field, changed) in [
        ("data_dir", r.data_dir != defaults.data_dir),
        ("redis_server", r.redis_server != defaults.redis_server),
        ("appendfsync", r.appendfsync != defaults.appendfsync),
    ] {
        ensure(!(changed && external.is_some()), &["redis"], field, || {
            format!(
                "applies only to the embedded redis-server, which does not run when {} is set",
                external.unwrap_or_default()
            )
        })?;
    }
    ensure(
        r.wait_replicas == 0 || external.is_some(),
        &["redis"],
        "wait_replicas",
        || "needs url or cluster_nodes: the embedded redis-server has no replicas".to_owned(),
    )
}

/// Timeouts, windows and periods that would break their loop at zero.
fn durations(c: &Config) -> Result<(), Violation> {
    let s = &c.subscriptions;
    for (table, field, value) in [
        ("redis", "connect_timeout", c.redis.connect_timeout),
        ("redis", "response_timeout", c.redis.response_timeout),
        // WAIT with a timeout of 0 would block forever.
        ("redis", "wait_timeout", c.redis.wait_timeout),
        ("dedup", "window", c.dedup.window),
        ("sweeper", "max_sleep", c.sweeper.max_sleep),
        ("subscriptions", "retention", s.retention),
        ("subscriptions", "ack_timeout", s.ack_timeout),
        ("subscriptions", "trim_every", s.trim_every),
        ("policy_store", "check_every", c.policy_store.check_every),
    ] {
        ensure(!value.is_zero(), &[table], field, || {
            "must be greater than 0".to_owned()
        })?;
    }
    Ok(())
}

/// `[defaults]` and every `[keys."..."]` table, and the patterns themselves.
/// Each table's own fields are checked, then the rules between fields on
/// the table as its keys get it, merged over `[defaults]`.
pub(super) fn policies(c: &Config) -> Result<(), Violation> {
    let d = &c.defaults;
    let defaults = PolicyFields {
        max_items: Some(d.max_items),
        max_wait: Some(d.max_wait),
        max_bytes: d.max_bytes,
        max_idle: d.max_idle,
        capacity: Some(&d.capacity),
        deadline_lead: Some(d.deadline_lead),
        max_age: d.max_age,
    };
    defaults.check(c, &["defaults"])?;
    merged(d, None, &["defaults"])?;
    for (pattern, table) in &c.keys {
        key_policy(c, d, pattern, table)?;
    }
    Ok(())
}

/// The rules one key table (`pattern`'s) gets over the complete defaults
/// `d`, against `c`'s `[limits]`.
pub(super) fn key_policy(
    c: &Config,
    d: &PolicyDefaults,
    pattern: &str,
    table: &KeyPolicy,
) -> Result<(), Violation> {
    ensure(!pattern.is_empty(), &["keys"], pattern, || {
        "a key pattern must not be empty".to_owned()
    })?;
    let max_key_bytes = c.limits.max_key_bytes.as_u64();
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
        max_idle: table.max_idle,
        capacity: table.capacity.as_ref(),
        deadline_lead: table.deadline_lead,
        max_age: table.max_age,
    };
    fields.check(c, &["keys", pattern])?;
    merged(&table.over(d), Some(table), &["keys", pattern])
}

/// The fields of one policy table that are set.
struct PolicyFields<'a> {
    max_items: Option<NonZeroU32>,
    max_wait: Option<Duration>,
    max_bytes: Option<ByteSize>,
    max_idle: Option<Duration>,
    capacity: Option<&'a BTreeMap<String, u64>>,
    deadline_lead: Option<Duration>,
    max_age: Option<Duration>,
}

impl PolicyFields<'_> {
    /// Checks the set fields against `[limits]` and their bounds.
    fn check(&self, c: &Config, table: &[&str]) -> Result<(), Violation> {
        let limit = c.limits.max_items;
        if let Some(n) = self.max_items {
            ensure(n <= limit, table, "max_items", || {
                format!("must be between 1 and {limit} (limits.max_items), got {n}")
            })?;
        }
        let longest = humantime::format_duration(MAX_WAIT_LIMIT);
        for (field, value, zero_ok) in [
            ("max_wait", self.max_wait, false),
            ("max_idle", self.max_idle, false),
            ("deadline_lead", self.deadline_lead, true),
            ("max_age", self.max_age, false),
        ] {
            let Some(value) = value else { continue };
            let ok = (zero_ok || !value.is_zero()) && value <= MAX_WAIT_LIMIT;
            ensure(ok, table, field, || {
                let least = if zero_ok { "" } else { "greater than 0 and " };
                let got = humantime::format_duration(value);
                format!("must be {least}at most {longest}, got {got}")
            })?;
        }
        if let Some(bytes) = self.max_bytes {
            ensure(bytes.as_u64() > 0, table, "max_bytes", || {
                "must be at least 1 when set, got 0".to_owned()
            })?;
        }
        let named = self.capacity.map_or(0, BTreeMap::len);
        ensure(named <= MAX_CAPACITY_MEASURES, table, "capacity", || {
            format!("names {named} measures, more than the {MAX_CAPACITY_MEASURES} allowed")
        })?;
        for (name, &value) in self.capacity.into_iter().flatten() {
            ensure(measure_name_ok(name), table, "capacity", || {
                format!("{name:?} is not a measure name: use 1 to 64 of A-Z a-z 0-9 _ - .")
            })?;
            ensure(
                (1..=MAX_MEASURE).contains(&value),
                table,
                "capacity",
                || format!("{name}: must be between 1 and {MAX_MEASURE}, got {value}"),
            )?;
        }
        Ok(())
    }
}

/// The rules between fields of the `merged` table its keys get: `min_items`
/// needs `max_age` and at most `max_items`, and `max_age` is at least
/// `max_wait`. `own` is the key table it came from (`None` for `[defaults]`),
/// so a message can say which values came from `[defaults]`.
fn merged(m: &PolicyDefaults, own: Option<&KeyPolicy>, table: &[&str]) -> Result<(), Violation> {
    let from = |set_here: bool| if set_here { "" } else { " (from [defaults])" };
    let min = m.min_items;
    let min_from = from(own.is_none_or(|k| k.min_items.is_some()));
    if min > 0 {
        ensure(m.max_age.is_some(), table, "min_items", || {
            format!(
                "min_items = {min}{min_from} needs max_age: a group held below min_items \
                 must still leave at some age (nothing may wait forever)"
            )
        })?;
    }
    let max_items = m.max_items;
    ensure(min <= max_items.get(), table, "min_items", || {
        let items_from = from(own.is_none_or(|k| k.max_items.is_some()));
        format!("{min}{min_from} must be at most max_items = {max_items}{items_from}")
    })?;
    if let Some(age) = m.max_age {
        ensure(age >= m.max_wait, table, "max_age", || {
            let wait_from = from(own.is_none_or(|k| k.max_wait.is_some()));
            format!(
                "{}{} must be at least max_wait = {}{wait_from}",
                humantime::format_duration(age),
                from(own.is_none_or(|k| k.max_age.is_some())),
                humantime::format_duration(m.max_wait),
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;

    /// The one-line error `text` is rejected with.
    fn err(text: &str) -> String {
        Config::parse(text, "batcher.toml").unwrap_err().to_string()
    }

    /// One way to reach Redis, with only the settings that way uses; a
    /// cluster and `WAIT` parse.
    #[test]
    fn redis_topology() {
        let c = Config::parse(
            "[redis]\ncluster_nodes = [\"redis://a:1\", \"redis://b:2\"]\n\
             wait_replicas = 1\nwait_timeout = \"20ms\"\n",
            "batcher.toml",
        )
        .unwrap();
        assert_eq!(c.redis.cluster_nodes, ["redis://a:1", "redis://b:2"]);
        assert_eq!(c.redis.wait_replicas, 1);
        assert_eq!(c.redis.wait_timeout, Duration::from_millis(20));

        let url = "[redis]\nurl = \"redis://a:1\"\n";
        let nodes = "cluster_nodes = [\"redis://b:1\"]\n";
        let embedded_only = "applies only to the embedded redis-server, which does not run when";
        for (text, want) in [
            (
                format!("{url}{nodes}"),
                "[redis] cluster_nodes: cannot be given together with url: name one Redis or one cluster (line 3".to_owned(),
            ),
            (
                "[redis]\ncluster_nodes = [\"b:1\"]\n".to_owned(),
                "[redis] cluster_nodes: each node must start with redis://".to_owned(),
            ),
            (
                format!("{url}data_dir = \"/x\"\n"),
                format!("[redis] data_dir: {embedded_only} url is set (line 3"),
            ),
            (
                format!("[redis]\n{nodes}appendfsync = \"no\"\n"),
                format!("[redis] appendfsync: {embedded_only} cluster_nodes is set (line 3"),
            ),
            (
                "[redis]\nwait_replicas = 1\n".to_owned(),
                "[redis] wait_replicas: needs url or cluster_nodes".to_owned(),
            ),
            (
                format!("{url}wait_timeout = \"0s\"\n"),
                "[redis] wait_timeout: must be greater than 0 (line 3".to_owned(),
            ),
        ] {
            let msg = err(&text);
            assert!(msg.contains(&want), "{text:?}: got {msg:?}, want {want:?}");
        }
    }

    /// Seed nodes must agree on credentials and scheme, and say so without
    /// echoing a password; `tls_ca_file` goes only with a `rediss://` URL.
    #[test]
    fn redis_credentials_and_tls_ca() {
        let c = Config::parse(
            "[redis]\ncluster_nodes = [\"rediss://u:p@a:1\", \"rediss://u:p@b:2\"]\n\
             tls_ca_file = \"ca.pem\"\n",
            "batcher.toml",
        )
        .unwrap();
        assert_eq!(c.redis.tls_ca_file.as_deref(), Some("ca.pem".as_ref()));
        let c = Config::parse(
            "[redis]\nurl = \"rediss://:p@a:1\"\ntls_ca_file = \"ca.pem\"\n",
            "batcher.toml",
        )
        .unwrap();
        assert_eq!(c.redis.url.as_deref(), Some("rediss://:p@a:1"));

        let nodes = "[redis]\ncluster_nodes = ";
        let differ = "[redis] cluster_nodes: node 1 and node 0 differ in user or password";
        for (text, want) in [
            (
                format!("{nodes}[\"redis://:secret1@a:1\", \"redis://:secret2@b:2\"]\n"),
                format!("{differ}: every node must carry the same credentials"),
            ),
            (
                format!("{nodes}[\"redis://a:1\", \"redis://:secret2@b:2\"]\n"),
                differ.to_owned(),
            ),
            (
                format!("{nodes}[\"redis://u1:secret@a:1\", \"redis://u2:secret@b:2\"]\n"),
                differ.to_owned(),
            ),
            (
                format!("{nodes}[\"rediss://a:1\", \"redis://b:2\"]\n"),
                "[redis] cluster_nodes: node 1 and node 0 differ in scheme".to_owned(),
            ),
            (
                format!("{nodes}[\"redis://a:1\", \"redis://b:port\"]\n"),
                "[redis] cluster_nodes: node 1 is not a valid Redis URL".to_owned(),
            ),
            (
                "[redis]\nurl = \"redis://a:1\"\ntls_ca_file = \"ca.pem\"\n".to_owned(),
                "[redis] tls_ca_file: applies only to TLS: needs a rediss:// url".to_owned(),
            ),
            (
                "[redis]\ntls_ca_file = \"ca.pem\"\n".to_owned(),
                "[redis] tls_ca_file: applies only to TLS".to_owned(),
            ),
            (
                "[redis]\nurl = \"rediss://a:1\"\ntls_ca_file = \"\"\n".to_owned(),
                "[redis] tls_ca_file: must not be empty when set (line 3".to_owned(),
            ),
        ] {
            let msg = err(&text);
            assert!(msg.contains(&want), "{text:?}: got {msg:?}, want {want:?}");
            assert!(!msg.contains("secret"), "{msg:?} echoes a password");
        }
    }
}
