//! Roles and key scopes on the policy store's methods: reading needs the
//! read role and changing admin, a token's key prefixes limit the patterns
//! it sees and changes, and only an unscoped token touches the defaults.

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::policy_store::{store_on, update};
use crate::support::{RedisServer, Service, eventually};

/// Tokens for the scope test: (name = secret, roles, key prefixes).
const TOKENS: [(&str, &str, &str); 3] = [
    ("reader", "\"read\"", ""),
    ("north-admin", "\"admin\"", "\"north-\""),
    ("admin", "\"admin\"", ""),
];

type Authed =
    BatcherClient<tonic::service::interceptor::InterceptedService<Channel, batcher::cli::Bearer>>;

/// A client of `service` that sends token `name`.
fn authed(service: &Service, name: &str) -> Authed {
    let value = format!("Bearer {name}").parse().unwrap();
    let channel = crate::support::channel(service.addr);
    BatcherClient::with_interceptor(channel, batcher::cli::Bearer(Some(value)))
}

/// The `[[auth.tokens]]` tables of [`TOKENS`].
fn tokens_toml() -> String {
    use sha2::{Digest, Sha256};
    TOKENS
        .iter()
        .map(|(name, roles, prefixes)| {
            let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
            format!(
                "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\n\
                 roles = [{roles}]\nkey_prefixes = [{prefixes}]\n"
            )
        })
        .collect()
}

/// Reading policies needs the read role and changing them admin; a
/// token's key prefixes limit the patterns it lists and changes, and only
/// an unscoped token touches the defaults; the history names the token.
#[tokio::test]
async fn roles_and_key_scopes_apply_to_policies() {
    let tokens = tokens_toml();
    let files = "[keys.\"north-1\"]\nmax_items = 5\n[keys.\"south-1\"]\nmax_items = 6\n";
    let redis = RedisServer::start();
    let text = store_on(&format!("{files}{tokens}"));
    let service = Service::start(crate::support::config(&redis.url(), &text)).await;
    let (mut reader, mut north, mut admin) = (
        authed(&service, "reader"),
        authed(&service, "north-admin"),
        authed(&service, "admin"),
    );
    let ready = eventually("the store to load", || {
        let mut c = admin.clone();
        async move {
            c.list_policies(pb::ListPoliciesRequest::default())
                .await
                .ok()
        }
    });
    ready.await;
    let name = "policies/keys/south-1".to_owned();
    let got = reader
        .get_policy(pb::GetPolicyRequest { name })
        .await
        .unwrap();
    assert_eq!(got.into_inner().max_items, Some(6));
    let set = |name: &str| {
        update(
            name,
            pb::Policy {
                max_items: Some(9),
                ..Default::default()
            },
            &["max_items"],
            "",
        )
    };
    let denied = reader.update_policy(set("keys/north-1")).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    for name in ["keys/south-1", "keys/*", "defaults"] {
        let status = north.update_policy(set(name)).await.unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{name}: {status:?}");
    }
    let changed = north
        .update_policy(set("keys/north-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(changed.updated_by, "token north-admin");
    let listed = north
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = listed.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["policies/keys/north-1"]);
    let all = admin
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = all.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "policies/defaults",
            "policies/keys/north-1",
            "policies/keys/south-1"
        ]
    );
    service.stop().await;
}
