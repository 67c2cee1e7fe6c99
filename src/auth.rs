//! Bearer tokens with roles and key scopes, for the `batcher.v1.Batcher`
//! service only (health and reflection stay open).
//!
//! [`Guarded`] wraps the Batcher service. For each call it reads
//! `authorization: Bearer <token>`, finds the token by its SHA-256 (compared
//! with every configured digest in constant time), checks that one of the
//! token's roles allows the method (from the request path), and puts the
//! token's [`Caller`] into the request's extensions. The handlers then check
//! each key against the caller's key prefixes. A refused call never reaches
//! a handler, so nothing is written. Tokens are swapped in on SIGHUP; the
//! tokens themselves are never logged.

use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwapOption;
use futures::future::Either;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tonic::Code;
use tonic::server::NamedService;
use tower_service::Service;

use crate::config::{AuthConfig, Role};
use crate::error::Error;
use crate::store::Store;
use crate::subscribers::Filter;

/// The Batcher methods and the role that allows each (admin allows all).
const METHODS: [(&str, Role); 17] = [
    ("Add", Role::Produce),
    ("AddMany", Role::Produce),
    ("Remove", Role::Produce),
    ("Subscribe", Role::Consume),
    ("Ack", Role::Consume),
    ("Requeue", Role::Consume),
    ("GetGroup", Role::Read),
    ("ListGroups", Role::Read),
    ("Flush", Role::Admin),
    ("ListDeadLetters", Role::Admin),
    ("Redrive", Role::Admin),
    ("GetPolicy", Role::Read),
    ("ListPolicies", Role::Read),
    ("ListPolicyRevisions", Role::Read),
    ("UpdatePolicy", Role::Admin),
    ("DeletePolicy", Role::Admin),
    ("ImportPolicies", Role::Admin),
];

/// One configured token, by the SHA-256 of its secret.
struct Token {
    digest: [u8; 32],
    roles: Vec<Role>,
    caller: Caller,
}

/// The tokens in force, shared by the guard and the SIGHUP reloader; cheap
/// to clone. Holds no tokens when auth is off.
#[derive(Clone, Default)]
pub struct Auth {
    /// `None`: auth is off (no `[auth]` table).
    tokens: Arc<ArcSwapOption<Vec<Token>>>,
}

impl Auth {
    /// The tokens of `config`; `None` turns auth off.
    pub fn new(config: Option<&AuthConfig>) -> Auth {
        let auth = Auth::default();
        auth.tokens.store(config.map(tokens));
        auth
    }

    /// Swaps in the tokens of a reloaded config. Removing `[auth]` would
    /// open the port to anyone: that takes a restart.
    pub fn reload(&self, config: Option<&AuthConfig>) {
        match (self.tokens.load().is_some(), config) {
            (_, Some(config)) => {
                self.tokens.store(Some(tokens(config)));
                tracing::info!(tokens = config.tokens.len(), "auth tokens reloaded");
            }
            (true, None) => tracing::error!(
                "[auth] was removed; the tokens in force stay until the service restarts"
            ),
            (false, None) => {}
        }
    }

    /// Whether tokens are required.
    pub fn is_on(&self) -> bool {
        self.tokens.load().is_some()
    }

    /// Wraps `inner`, the Batcher service, so that every call needs a token.
    pub fn guard<S>(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            auth: self.clone(),
        }
    }

    /// The caller of `method` with `authorization` header value, or why it
    /// is refused. `None` when auth is off. The web view's API calls it too.
    pub fn check(
        &self,
        method: &str,
        authorization: Option<&[u8]>,
    ) -> Result<Option<Caller>, Error> {
        let tokens = self.tokens.load();
        let Some(tokens) = tokens.as_ref() else {
            return Ok(None);
        };
        let secret = authorization.and_then(bearer).ok_or_else(|| {
            Error::refused(
                Code::Unauthenticated,
                "TOKEN_MISSING",
                "this call needs a token: send `authorization: Bearer <token>`",
            )
        })?;
        let token = find(tokens, secret).ok_or_else(|| {
            Error::refused(
                Code::Unauthenticated,
                "TOKEN_UNKNOWN",
                "the token is not known",
            )
        })?;
        let Some(&(name, role)) = METHODS.iter().find(|(name, _)| *name == method) else {
            return Ok(Some(token.caller.clone())); // the service answers UNIMPLEMENTED
        };
        if !token.roles.iter().any(|r| *r == role || *r == Role::Admin) {
            let role = role_name(role);
            return Err(Error::refused(
                Code::PermissionDenied,
                "ROLE_MISSING",
                format!(
                    "token {:?} may not call {name}: that needs the role {role} (or admin)",
                    token.caller.token
                ),
            )
            .with("role", role)
            .with("method", name)
            .with("token", &token.caller.token));
        }
        Ok(Some(token.caller.clone()))
    }
}

/// The configured tokens, with their hex digests decoded (`guard::check`
/// has checked them).
fn tokens(config: &AuthConfig) -> Arc<Vec<Token>> {
    let tokens = config.tokens.iter().map(|t| {
        let mut digest = [0; 32];
        hex::decode_to_slice(&t.sha256, &mut digest).unwrap_or_else(|_| {
            tracing::error!(token = %t.name, "sha256 is not 64 hex digits; the token never matches")
        });
        Token {
            digest,
            roles: t.roles.clone(),
            caller: Caller {
                token: t.name.clone(),
                prefixes: t.key_prefixes.clone(),
            },
        }
    });
    Arc::new(tokens.collect())
}

/// The secret of an `authorization: Bearer <token>` value (the scheme is
/// case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    let secret = rest.trim_ascii();
    (scheme.eq_ignore_ascii_case(b"bearer ") && !secret.is_empty()).then_some(secret)
}

/// The token whose digest is the SHA-256 of `secret`. Every digest is
/// compared, in constant time, match or not, so the time taken says nothing
/// about which token (if any) matched.
fn find<'a>(tokens: &'a [Token], secret: &[u8]) -> Option<&'a Token> {
    let digest: [u8; 32] = Sha256::digest(secret).into();
    let mut found = 0u32; // 1 + the index of the match; 0: none
    for (i, token) in tokens.iter().enumerate() {
        let index = u32::try_from(i + 1).unwrap_or(u32::MAX);
        found.conditional_assign(&index, token.digest.ct_eq(&digest));
    }
    found.checked_sub(1).and_then(|i| tokens.get(i as usize))
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Produce => "produce",
        Role::Consume => "consume",
        Role::Read => "read",
        Role::Admin => "admin",
    }
}

/// Who is calling: the token's name and the key prefixes it is limited to.
/// With auth off, or a token without `key_prefixes`, every key is in scope.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// The token's name (never the token itself); empty with auth off.
    token: String,
    /// Empty: every key.
    prefixes: Vec<String>,
}

impl Caller {
    /// The caller the guard put into `request`; with auth off, one whose
    /// scope is every key.
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default()
    }

    /// The token's name; empty with auth off.
    pub fn name(&self) -> &str {
        &self.token
    }

    /// PERMISSION_DENIED unless the token's prefixes cover a policy's key
    /// pattern (its text before any `*` starts with one of them); the
    /// defaults (`None`) apply to every key, so only an unscoped token
    /// covers them.
    pub fn check_pattern(&self, pattern: Option<&str>) -> Result<(), Error> {
        match pattern {
            Some(pattern) if self.in_scope(pattern) => Ok(()),
            Some(pattern) => Err(self.out_of_scope("policy pattern", pattern)),
            None if self.prefixes.is_empty() => Ok(()),
            None => Err(self.out_of_scope("policy", "defaults")),
        }
    }

    fn in_scope(&self, key: &str) -> bool {
        self.prefixes.is_empty() || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }

    fn out_of_scope(&self, what: &str, key: &str) -> Error {
        Error::refused(
            Code::PermissionDenied,
            "KEY_OUT_OF_SCOPE",
            format!(
                "{what} {key:?} is outside the key prefixes of token {:?}",
                self.token
            ),
        )
        .with("key", key)
        .with("token", &self.token)
    }

    /// Whether the caller may see every key (auth off, or a token without
    /// key prefixes).
    pub fn reaches_every_key(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// PERMISSION_DENIED unless `key` starts with one of the token's prefixes.
    pub fn check_key(&self, key: &str) -> Result<(), Error> {
        match self.in_scope(key) {
            true => Ok(()),
            false => Err(self.out_of_scope("key", key)),
        }
    }

    /// [`Caller::check_key`] for every key: all in scope, or the first that is not.
    pub fn check_keys<'a>(&self, mut keys: impl Iterator<Item = &'a str>) -> Result<(), Error> {
        keys.try_for_each(|key| self.check_key(key))
    }

    /// The prefixes ListGroups lists for `asked`, its request's `key_prefix`:
    /// `asked` itself when in scope; all of the token's own when empty.
    pub fn list_prefixes(&self, asked: &str) -> Result<Vec<String>, Error> {
        if asked.is_empty() && !self.prefixes.is_empty() {
            return Ok(self.prefixes.clone());
        }
        match self.in_scope(asked) {
            true => Ok(vec![asked.to_owned()]),
            false => Err(self.out_of_scope("key_prefix", asked)),
        }
    }

    /// PERMISSION_DENIED unless every key and prefix of a Subscribe filter
    /// is in scope. An empty filter is: it means the token's own prefixes.
    pub fn check_filter(&self, filter: &Filter) -> Result<(), Error> {
        for key in &filter.keys {
            self.check_key(key)?;
        }
        for prefix in &filter.prefixes {
            if !self.in_scope(prefix) {
                return Err(self.out_of_scope("key prefix", prefix));
            }
        }
        Ok(())
    }

    /// The filter a Subscribe gets: `filter`, or when it is empty, the
    /// token's own prefixes (still empty, every key, for an unscoped caller).
    pub fn narrow(&self, filter: Filter) -> Filter {
        match filter.is_empty() {
            true => Filter {
                keys: Default::default(),
                prefixes: self.prefixes.clone(),
            },
            false => filter,
        }
    }

    /// PERMISSION_DENIED unless the stored filter of consumer group `group`
    /// is within scope (a group over every key is not, for a scoped token).
    /// A group that does not exist holds nothing to touch.
    pub async fn check_group(&self, store: &Store, group: &str) -> Result<(), Error> {
        if self.prefixes.is_empty() {
            return Ok(());
        }
        let Some(definition) = store.consumer_group(group).await? else {
            return Ok(());
        };
        self.check_stored_filter(group, &Filter::decode(&definition).unwrap_or_default())
    }

    /// PERMISSION_DENIED unless `filter`, the stored filter of consumer group
    /// `group`, is within scope.
    pub fn check_stored_filter(&self, group: &str, filter: &Filter) -> Result<(), Error> {
        if !self.prefixes.is_empty() && filter.is_empty() {
            let err = self.out_of_scope("consumer group over every key:", group);
            return Err(err.with("consumer_group", group));
        }
        self.check_filter(filter)
            .map_err(|err| err.with("consumer_group", group))
    }
}

/// The Batcher service behind the token check; see [`Auth::guard`].
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    auth: Auth,
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

type HttpResponse = http::Response<tonic::body::Body>;

impl<S, B> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = HttpResponse>,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<HttpResponse, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        let authorization = request.headers().get(http::header::AUTHORIZATION);
        match self.auth.check(method, authorization.map(|v| v.as_bytes())) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Either::Left(self.inner.call(request))
            }
            Err(err) => Either::Right(ready(Ok(tonic::Status::from(err).into_http()))),
        }
    }
}

/// Logs a warning when `listen` is not a loopback address and auth is off
/// (anyone who can reach the port may then add, flush and read every key),
/// or tokens travel without TLS.
pub fn warn_if_open(auth: &Auth, tls: bool, listen: std::net::SocketAddr) {
    if listen.ip().is_loopback() {
        return;
    }
    if !auth.is_on() {
        tracing::warn!(
            %listen,
            "auth is off ([auth] is not configured) and the port is not on loopback: \
             anyone who can reach it may call every method"
        );
    } else if !tls {
        tracing::warn!(%listen, "tokens cross the network in clear text: configure [tls]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_takes_the_secret_of_a_bearer_header() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn find_matches_the_token_by_its_digest() {
        let token = |secret: &str, name: &str| Token {
            digest: Sha256::digest(secret.as_bytes()).into(),
            roles: vec![Role::Read],
            caller: Caller {
                token: name.into(),
                prefixes: Vec::new(),
            },
        };
        let tokens = [token("one", "a"), token("two", "b")];
        assert_eq!(
            find(&tokens, b"two").map(|t| &t.caller.token[..]),
            Some("b")
        );
        assert_eq!(
            find(&tokens, b"one").map(|t| &t.caller.token[..]),
            Some("a")
        );
        assert!(find(&tokens, b"three").is_none());
    }
}
