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
    /// Subscribe, Ack, Requeue.
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

/// Checks the rules of these tables that no type expresses. The `[tls]`
/// files are not read here: start-up reads them, and names a bad one.
pub(super) fn check(config: &Config) -> Result<(), Violation> {
    if let Some(auth) = &config.auth {
        tokens(&auth.tokens)?;
    }
    let r = &config.redis;
    if r.password_file.is_some() && r.url.is_none() && r.cluster_nodes.is_empty() {
        return Err(violation(
            &["redis", "password_file"],
            "needs url or cluster_nodes: the embedded redis-server has no password".to_owned(),
        ));
    }
    message_bytes(config)
}

/// `[limits] max_message_bytes` holds at least one add of the largest key,
/// item id and payload, with room for the protobuf framing.
fn message_bytes(config: &Config) -> Result<(), Violation> {
    const FRAMING: u64 = 64;
    let l = &config.limits;
    let one_add = l.max_key_bytes.as_u64()
        + l.max_item_id_bytes.as_u64()
        + l.max_payload_bytes.as_u64()
        + FRAMING;
    if l.max_message_bytes.as_u64() < one_add {
        return Err(violation(
            &["limits", "max_message_bytes"],
            format!(
                "must hold one add of the largest key, item id and payload: at least {one_add} \
                 bytes, got {}",
                l.max_message_bytes.as_u64()
            ),
        ));
    }
    Ok(())
}

/// `[[auth.tokens]]`: at least one; each with a unique name and digest, a
/// 64-hex-digit sha256, a role, and no empty key prefix.
fn tokens(tokens: &[TokenConfig]) -> Result<(), Violation> {
    let at = |field: &str| ["auth", "tokens", field].map(str::to_owned);
    if tokens.is_empty() {
        return Err(violation(
            &at("")[..2],
            "[auth] has no [[auth.tokens]]: add one, or remove the [auth] table to turn auth off"
                .to_owned(),
        ));
    }
    for (i, token) in tokens.iter().enumerate() {
        let name = &token.name;
        let bad = if name.is_empty() {
            Some(("name", "must not be empty".to_owned()))
        } else if tokens[..i].iter().any(|t| t.name == *name) {
            Some(("name", format!("{name:?} is the name of an earlier token")))
        } else if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hint = "64 hex digits, as `printf %s \"$TOKEN\" | sha256sum` prints";
            Some(("sha256", format!("of token {name:?} must be {hint}")))
        } else if tokens[..i]
            .iter()
            .any(|t| t.sha256.eq_ignore_ascii_case(&token.sha256))
        {
            Some((
                "sha256",
                format!("of token {name:?} is that of an earlier token"),
            ))
        } else if token.roles.is_empty() {
            let roles = "produce, consume, read or admin";
            Some((
                "roles",
                format!("of token {name:?} must name at least one of {roles}"),
            ))
        } else if token.key_prefixes.iter().any(String::is_empty) {
            let why = "an empty prefix matches every key (leave key_prefixes out for that)";
            Some((
                "key_prefixes",
                format!("of token {name:?} holds \"\": {why}"),
            ))
        } else {
            None
        };
        if let Some((field, message)) = bad {
            return Err(violation(&at(field), message));
        }
    }
    Ok(())
}

fn violation(path: &[impl AsRef<str>], message: String) -> Violation {
    Violation {
        path: path.iter().map(|s| s.as_ref().to_owned()).collect(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    const DIGEST: &str = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";

    /// The error of config `text`, or `None` when it loads.
    fn error(text: &str) -> Option<String> {
        Config::parse(text, "t.toml").err().map(|e| e.to_string())
    }

    fn token(name: &str, sha256: &str, rest: &str) -> String {
        format!("[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{sha256}\"\n{rest}\n")
    }

    /// Tokens, password_file and max_message_bytes are refused with the rule they break.
    #[test]
    fn tokens_are_checked() {
        let roles = "roles = [\"read\"]";
        let good = token("a", DIGEST, roles);
        assert_eq!(error(&good), None);
        let other = DIGEST.replace('2', "3");
        assert_eq!(error(&format!("{good}{}", token("b", &other, roles))), None);
        for (text, want) in [
            (
                "[auth]\n".to_owned(),
                "remove the [auth] table to turn auth off",
            ),
            (
                token("a", "abc", roles),
                "sha256: of token \"a\" must be 64 hex digits",
            ),
            (
                token("a", &DIGEST.replace('2', "g"), roles),
                "must be 64 hex digits",
            ),
            (
                token("a", DIGEST, "roles = []"),
                "roles: of token \"a\" must name at least one",
            ),
            (
                format!("{good}{}", token("a", &other, roles)),
                "is the name of an earlier token",
            ),
            (
                format!("{good}{}", token("b", DIGEST, roles)),
                "is that of an earlier token",
            ),
            (
                token("a", DIGEST, "roles = [\"read\"]\nkey_prefixes = [\"\"]"),
                "empty prefix",
            ),
            (
                "[redis]\npassword_file = \"p\"\n".to_owned(),
                "needs url or cluster_nodes",
            ),
            (
                "[limits]\nmax_message_bytes = \"64KiB\"\n".to_owned(),
                "[limits] max_message_bytes: must hold one add of the largest key, item id and \
                 payload: at least 66112 bytes",
            ),
        ] {
            let err = error(&text).unwrap_or_else(|| panic!("{text} loads"));
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
