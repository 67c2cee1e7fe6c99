//! `[[sinks]]`: where the service itself delivers batches, each sink a
//! durable consumer group whose ack is the sink's acceptance (see
//! docs/sinks.md).
//!
//! A sink has a name, a `kind`, the `keys` it takes (`*` globs, as the
//! policies' key tables) and an `options` table whose fields depend on the
//! kind. The options are decoded once the kind is known, so an unknown
//! field of one kind is refused by name, as everywhere in the file.
//!
//! ```toml
//! [[sinks]]
//! name = "trucks"
//! kind = "webhook"
//! keys = ["north", "south-*"]
//! [sinks.options]
//! url = "https://tms.example/batches"
//! secret_file = "/etc/batcher/trucks.secret"
//! ```

use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Default `lease`: how long an instance's hold on a shard of a sink
/// outlasts the instance.
pub const DEFAULT_SINK_LEASE: Duration = Duration::from_secs(10);
/// Default webhook `timeout`.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Default webhook `max_attempts`.
pub const DEFAULT_WEBHOOK_MAX_ATTEMPTS: NonZeroU32 = NonZeroU32::new(10).expect("10 is not 0");
/// Default webhook `max_age` (1 hour): a batch still undelivered this long
/// after its flush goes to the dead letters.
pub const DEFAULT_WEBHOOK_MAX_AGE: Duration = Duration::from_secs(60 * 60);
/// Default webhook `max_in_flight`: keys delivered side by side.
pub const DEFAULT_WEBHOOK_MAX_IN_FLIGHT: NonZeroUsize = NonZeroUsize::new(16).expect("16 is not 0");
/// Default webhook `backoff_min`: the first retry's delay.
pub const DEFAULT_WEBHOOK_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Default webhook `backoff_max`: the longest delay between attempts.
pub const DEFAULT_WEBHOOK_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// Longest sink name, in bytes.
pub const MAX_SINK_NAME_BYTES: usize = 64;

/// One `[[sinks]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSink")]
pub struct SinkConfig {
    /// The sink's name: its consumer group is `sink.<name>`, so it must stay
    /// the same for the sink to keep its place and its dead letters.
    pub name: String,
    /// The keys whose batches the sink takes: exact keys and `*` globs;
    /// `["*"]` (the default) takes every key.
    pub keys: Vec<String>,
    /// How long an instance's hold on a shard of the sink lasts without
    /// being renewed: after a crash, another instance takes the shard over
    /// (and redelivers what was in flight) this long after.
    pub lease: Duration,
    /// Where and how batches go.
    pub options: SinkOptions,
}

impl SinkConfig {
    /// The consumer group under the sink.
    pub fn group(&self) -> String {
        format!("sink.{}", self.name)
    }

    /// The kind, as the file names it.
    pub fn kind(&self) -> SinkKind {
        match self.options {
            SinkOptions::Webhook(_) => SinkKind::Webhook,
        }
    }
}

/// The kinds of sinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// An HTTP POST of each batch, signed (Standard Webhooks).
    Webhook,
}

/// A sink's options, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkOptions {
    Webhook(WebhookOptions),
}

/// The options of a webhook sink.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookOptions {
    /// Where each batch is POSTed: an `http://` or `https://` URL.
    pub url: String,
    /// How long one attempt may take, connection and answer included.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts before a batch goes to the dead letters.
    pub max_attempts: NonZeroU32,
    /// How long after its flush a batch may still be retried.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Keys delivered side by side (each with at most one batch in flight).
    pub max_in_flight: NonZeroUsize,
    /// The first retry's delay; each next one doubles, up to `backoff_max`.
    #[serde(with = "humantime_serde")]
    pub backoff_min: Duration,
    /// The longest delay between two attempts (a `Retry-After` may ask more).
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// A file holding the signing secret (`whsec_<base64>`, or any other
    /// text taken as raw bytes). Exactly one of this and `secret_env`.
    pub secret_file: Option<PathBuf>,
    /// An environment variable holding the signing secret.
    pub secret_env: Option<String>,
    /// During a rotation: the other secret, a file. Each request is then
    /// signed with both, so the receiver may verify with either.
    pub previous_secret_file: Option<PathBuf>,
    /// During a rotation: the other secret, an environment variable.
    pub previous_secret_env: Option<String>,
    /// PEM root certificate(s) trusted for `https://`, besides the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS (with `client_key_file`).
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        WebhookOptions {
            url: String::new(),
            timeout: DEFAULT_WEBHOOK_TIMEOUT,
            max_attempts: DEFAULT_WEBHOOK_MAX_ATTEMPTS,
            max_age: DEFAULT_WEBHOOK_MAX_AGE,
            max_in_flight: DEFAULT_WEBHOOK_MAX_IN_FLIGHT,
            backoff_min: DEFAULT_WEBHOOK_BACKOFF_MIN,
            backoff_max: DEFAULT_WEBHOOK_BACKOFF_MAX,
            secret_file: None,
            secret_env: None,
            previous_secret_file: None,
            previous_secret_env: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
        }
    }
}

/// A `[[sinks]]` table as written, its options not yet decoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    name: String,
    kind: SinkKind,
    #[serde(default = "every_key")]
    keys: Vec<String>,
    #[serde(default = "default_lease", with = "humantime_serde")]
    lease: Duration,
    #[serde(default)]
    options: toml::Table,
}

fn every_key() -> Vec<String> {
    vec!["*".to_owned()]
}

fn default_lease() -> Duration {
    DEFAULT_SINK_LEASE
}

impl TryFrom<RawSink> for SinkConfig {
    type Error = String;

    /// Decodes the options as the kind's, naming the field that is wrong.
    fn try_from(raw: RawSink) -> Result<Self, String> {
        let options = match raw.kind {
            SinkKind::Webhook => {
                let value = toml::Value::Table(raw.options);
                let options: WebhookOptions = serde_path_to_error::deserialize(value)
                    .map_err(|err| format!("options.{}: {}", err.path(), err.inner()))?;
                SinkOptions::Webhook(options)
            }
        };
        Ok(SinkConfig {
            name: raw.name,
            keys: raw.keys,
            lease: raw.lease,
            options,
        })
    }
}

/// Checks the `[[sinks]]` rules no type expresses: names unique and of the
/// allowed characters, key patterns not empty, a webhook's URL and its
/// secret, files that come in pairs, durations that must not be zero.
pub(super) fn check(sinks: &[SinkConfig]) -> Result<(), super::Violation> {
    let mut names = std::collections::HashSet::new();
    for (i, sink) in sinks.iter().enumerate() {
        let table = ["sinks".to_owned(), i.to_string()];
        let fail = |field: &str, message: String| {
            let mut path = table.to_vec();
            path.extend(field.split('.').map(str::to_owned));
            Err(super::Violation { path, message })
        };
        let name_ok = !sink.name.is_empty()
            && sink.name.len() <= MAX_SINK_NAME_BYTES
            && sink
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
        if !name_ok {
            let message = format!("must be 1 to {MAX_SINK_NAME_BYTES} of A-Z a-z 0-9 _ -");
            return fail("name", message);
        }
        if !names.insert(sink.name.as_str()) {
            return fail("name", format!("{:?} names two sinks", sink.name));
        }
        if sink.keys.is_empty() || sink.keys.iter().any(String::is_empty) {
            return fail(
                "keys",
                "must list at least one non-empty key or glob".into(),
            );
        }
        if sink.lease < Duration::from_millis(100) {
            return fail("lease", "must be at least 100ms".into());
        }
        match &sink.options {
            SinkOptions::Webhook(o) => {
                let https = o.url.starts_with("https://");
                if !(https || o.url.starts_with("http://")) || o.url.parse::<http::Uri>().is_err() {
                    let message = format!("must be an http:// or https:// URL, got {:?}", o.url);
                    return fail("options.url", message);
                }
                for (field, value) in [
                    ("options.timeout", o.timeout),
                    ("options.max_age", o.max_age),
                    ("options.backoff_min", o.backoff_min),
                ] {
                    if value.is_zero() {
                        return fail(field, "must be greater than 0".into());
                    }
                }
                if o.backoff_max < o.backoff_min {
                    return fail(
                        "options.backoff_max",
                        "must be at least options.backoff_min".into(),
                    );
                }
                if o.secret_file.is_some() == o.secret_env.is_some() {
                    return fail(
                        "options.secret_file",
                        "exactly one of secret_file and secret_env must be set".into(),
                    );
                }
                if o.previous_secret_file.is_some() && o.previous_secret_env.is_some() {
                    return fail(
                        "options.previous_secret_file",
                        "at most one of previous_secret_file and previous_secret_env".into(),
                    );
                }
                if o.client_cert_file.is_some() != o.client_key_file.is_some() {
                    return fail(
                        "options.client_cert_file",
                        "client_cert_file and client_key_file go together".into(),
                    );
                }
                let tls_files = o.ca_file.is_some() || o.client_cert_file.is_some();
                if tls_files && !https {
                    return fail(
                        "options.url",
                        "ca_file and client certificates need https://".into(),
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, SinkOptions};

    fn parse(sinks: &str) -> Result<Config, String> {
        Config::parse(sinks, "test.toml").map_err(|e| e.to_string())
    }

    const GOOD: &str = "[[sinks]]\nname = \"tms\"\nkind = \"webhook\"\nkeys = [\"north\", \"south-*\"]\n\
                        [sinks.options]\nurl = \"https://tms.example/hook\"\nsecret_env = \"TMS_SECRET\"\n\
                        timeout = \"3s\"\nmax_in_flight = 4\n";

    /// A webhook sink with its options, the rest at their defaults.
    #[test]
    fn a_webhook_sink() {
        let config = parse(GOOD).unwrap();
        let sink = &config.sinks[0];
        assert_eq!(sink.group(), "sink.tms");
        assert_eq!(sink.keys, ["north", "south-*"]);
        let SinkOptions::Webhook(o) = &sink.options;
        assert_eq!(o.timeout, std::time::Duration::from_secs(3));
        assert_eq!(o.max_in_flight.get(), 4);
        assert_eq!(o.max_attempts, super::DEFAULT_WEBHOOK_MAX_ATTEMPTS);
        assert_eq!(o.secret_env.as_deref(), Some("TMS_SECRET"));
    }

    /// Unknown fields, a bad duration, no secret, two sinks of one name and
    /// a non-HTTP URL are refused, each naming its field.
    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (GOOD.replace("timeout", "timout"), "timout"),
            (GOOD.replace("\"3s\"", "\"3 parsecs\""), "options.timeout"),
            (
                GOOD.replace("secret_env = \"TMS_SECRET\"", ""),
                "secret_file",
            ),
            (
                GOOD.replace("kind = \"webhook\"", "kind = \"carrier-pigeon\""),
                "kind",
            ),
            (GOOD.replace("https://tms", "ftp://tms"), "url"),
            (GOOD.replace("name = \"tms\"", "name = \"t m s\""), "name"),
            (format!("{GOOD}{GOOD}"), "names two sinks"),
            (
                GOOD.replace("keys = [\"north\", \"south-*\"]", "keys = []"),
                "keys",
            ),
            (
                GOOD.replace("name = \"tms\"\n", "name = \"tms\"\nurl = \"x\"\n"),
                "url",
            ),
        ];
        for (text, field) in cases {
            let err = parse(&text).expect_err(&text);
            assert!(err.contains(field), "{err:?} should name {field}");
        }
    }
}
