//! The guard-rail tables of the config: `[tls]` for the gRPC port,
//! `[auth]` tokens with roles and key scopes, the `[http]` listener of the
//! metrics endpoint, and `[log]`.
//!
//! ```toml
//! [tls]
//! cert = "server.pem"
//! key = "server.key"
//! client_ca = "ca.pem"        # optional: require client certificates signed by this CA
//!
//! [[auth.tokens]]
//! name = "depot-berlin"
//! sha256 = "<hex sha256 of the token>"
//! roles = ["produce", "consume"]
//! key_prefixes = ["berlin-"]  # optional: only keys starting with one of these
//!
//! [http]
//! listen = "127.0.0.1:9464"   # GET /metrics
//!
//! [log]
//! format = "json"             # or "text" (the default)
//! ```

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use serde::Deserialize;

use super::Config;
use super::validate::Violation;

/// Default `[http] listen`: loopback, so metrics are not exposed by accident.
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9464));

/// `[tls]`: TLS on the gRPC port. Files are PEM; relative paths are taken
/// from the working directory. They are re-read on SIGHUP.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// With this, clients must present a certificate signed by one of these CAs (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// `[auth]`: bearer tokens. Without this table, auth is off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The tokens the service accepts.
    pub tokens: Vec<TokenConfig>,
}

/// One `[[auth.tokens]]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds the token, for logs; never the token itself.
    pub name: String,
    /// Hex SHA-256 of the token: the token itself never sits in the file.
    pub sha256: String,
    /// What the token may do.
    pub roles: Vec<Role>,
    /// If not empty, the token may touch only keys that start with one of these.
    #[serde(default)]
    pub key_prefixes: Vec<String>,
}

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Add, AddMany, Remove.
    Produce,
    /// Subscribe, Ack.
    Consume,
    /// GetGroup, ListGroups.
    Read,
    /// All of the above, plus Flush, ListDeadLetters and Redrive.
    Admin,
}

/// `[http]`: the HTTP listener that serves `GET /metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Serve HTTP at all; on by default.
    pub enabled: bool,
    /// Address the HTTP listener binds; port 0 picks a free one.
    pub listen: SocketAddr,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            enabled: true,
            listen: DEFAULT_HTTP_LISTEN,
        }
    }
}

/// `[log]`: how log lines are written. The level comes from `RUST_LOG`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (the default) or `json`, one object per line.
    pub format: LogFormat,
}

/// The format of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Checks the rules of these tables that no type expresses.
pub(super) fn check(_config: &Config) -> Result<(), Violation> {
    Ok(())
}
