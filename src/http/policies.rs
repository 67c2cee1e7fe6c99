//! The web view's policy API (it needs `[policy_store] enabled = true`;
//! without it every route answers 400 with FAILED_PRECONDITION). Each route
//! is one call of the in-process gRPC service, so its roles, key scopes,
//! checks and errors are exactly gRPC's, in the protobuf JSON mapping:
//! - `GET /api/policies?prefix=&page_size=&page_token=`: ListPolicies.
//! - `GET /api/policies/{name}` (`defaults` or `keys/<pattern>`): GetPolicy.
//! - `PATCH /api/policies/{name}`: UpdatePolicy. The body is its request,
//!   `{"policy": {"maxItems": 25, "etag": "7"}, "updateMask": "maxItems",
//!   "reason": "..."}`; the path names the policy. A stale etag is 409
//!   (ABORTED, reason ETAG_MISMATCH) and writes nothing; a bad field is 400
//!   naming it (`policy.max_wait`), with a `BadRequest` detail.
//! - `GET /api/revisions?name=&page_size=&page_token=`: ListPolicyRevisions,
//!   the history (of one policy when `name` is given), newest first.
//!
//! Reading needs the `read` role, changing `admin` (403 otherwise); the
//! token comes as for `api` (a `token` parameter only on the reads). The
//! history names the token, or with auth off the browser's address.

use std::net::SocketAddr;
use std::sync::LazyLock;

use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde::Deserialize;
use tonic::Status;

use super::api::{Api, Sender, error};
use crate::error::invalid;
use crate::pb;
use crate::pb::batcher_server::Batcher;

/// The query of `GET /api/revisions`.
#[derive(Deserialize)]
pub struct RevisionsQuery {
    #[serde(default)]
    name: String,
    #[serde(default)]
    page_size: i32,
    #[serde(default)]
    page_token: String,
    token: Option<String>,
}

/// The query of `GET /api/policies/{name}`.
#[derive(Deserialize)]
pub struct TokenQuery {
    token: Option<String>,
}

/// The browser's address, when the listener records it.
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// The query, or INVALID_ARGUMENT saying what is wrong with it.
fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Status> {
    query
        .map(|Query(query)| query)
        .map_err(|rejection| Status::invalid_argument(rejection.body_text()))
}

/// `GET /api/policies`.
pub async fn list(
    State(api): State<Api>,
    headers: HeaderMap,
    listed: Result<Query<super::api::PageQuery>, QueryRejection>,
) -> Response {
    let q = match query(listed) {
        Ok(q) => q,
        Err(status) => return error(&status),
    };
    let message = pb::ListPoliciesRequest {
        page_size: q.page_size,
        page_token: q.page_token,
        key_prefix: q.prefix,
    };
    let from = Sender::new(&headers, q.token.as_deref(), None);
    let call = |service: crate::service::BatcherService, request| async move {
        service.list_policies(request).await
    };
    api.answer("ListPolicies", from, Ok(message), call).await
}

/// `GET /api/policies/{name}`.
pub async fn get(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    token: Result<Query<TokenQuery>, QueryRejection>,
) -> Response {
    let q = match query(token) {
        Ok(q) => q,
        Err(status) => return error(&status),
    };
    let message = pb::GetPolicyRequest {
        name: format!("policies/{name}"),
    };
    let from = Sender::new(&headers, q.token.as_deref(), None);
    let call = |service: crate::service::BatcherService, request| async move {
        service.get_policy(request).await
    };
    api.answer("GetPolicy", from, Ok(message), call).await
}

/// `PATCH /api/policies/{name}`.
pub async fn update(
    State(api): State<Api>,
    Path(name): Path<String>,
    peer: Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let name = format!("policies/{name}");
    let message = from_json::<pb::UpdatePolicyRequest>(&body).and_then(|mut req| {
        let policy = req.policy.get_or_insert_default();
        match policy.name.as_str() {
            "" => policy.name = name,
            given if given == name => {}
            given => {
                let message = format!("is {given:?}, but the path names {name:?}");
                return Err(invalid("policy.name", message).into());
            }
        }
        Ok(req)
    });
    let from = Sender::new(
        &headers,
        None,
        peer.map(|Extension(ConnectInfo(addr))| addr),
    );
    let call = |service: crate::service::BatcherService, request| async move {
        service.update_policy(request).await
    };
    api.answer("UpdatePolicy", from, message, call).await
}

/// `GET /api/revisions`.
pub async fn revisions(
    State(api): State<Api>,
    headers: HeaderMap,
    listed: Result<Query<RevisionsQuery>, QueryRejection>,
) -> Response {
    let q = match query(listed) {
        Ok(q) => q,
        Err(status) => return error(&status),
    };
    let message = pb::ListPolicyRevisionsRequest {
        name: q.name,
        page_size: q.page_size,
        page_token: q.page_token,
    };
    let from = Sender::new(&headers, q.token.as_deref(), None);
    let call = |service: crate::service::BatcherService, request| async move {
        service.list_policy_revisions(request).await
    };
    api.answer("ListPolicyRevisions", from, Ok(message), call)
        .await
}

/// The descriptors of `batcher.v1`, decoded once, to read requests in the
/// JSON mapping.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("the compiled-in descriptors decode")
});

/// A request in the protobuf JSON mapping (unknown fields refused), or
/// INVALID_ARGUMENT naming the field that does not parse, by its proto
/// name (`policy.max_wait`).
fn from_json<M: prost::Name + Default>(body: &[u8]) -> Result<M, Status> {
    let descriptor = POOL
        .get_message_by_name(&M::full_name())
        .expect("every batcher.v1 message has a descriptor");
    let mut json = serde_json::Deserializer::from_slice(body);
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(&mut json, &mut track);
    let parsed = DynamicMessage::deserialize(descriptor, tracked);
    let parsed = parsed.and_then(|message| json.end().map(|()| message));
    match parsed {
        Ok(message) => message
            .transcode_to::<M>()
            .map_err(|e| Status::internal(e.to_string())),
        Err(err) => {
            let field = match track.path().to_string() {
                root if root == "." || root == "?" => "body".to_owned(),
                path => snake_case(&path),
            };
            Err(invalid(field, err.to_string()).into())
        }
    }
}

/// A JSON field path in the proto's names: `policy.maxWait` is
/// `policy.max_wait`.
fn snake_case(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 4);
    for c in path.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An UpdatePolicy body in the JSON mapping reads into the request:
    /// durations, the mask (in proto names), the etag and the reason.
    #[test]
    fn an_update_body_reads_in_the_json_mapping() {
        let body = br#"{"policy": {"maxItems": 25, "maxWait": "240s", "etag": "7"},
            "updateMask": "maxItems,maxWait", "reason": "peak"}"#;
        let req: pb::UpdatePolicyRequest = from_json(body).expect("a good body");
        let policy = req.policy.expect("a policy");
        assert_eq!(policy.max_items, Some(25));
        assert_eq!(policy.max_wait.map(|d| d.seconds), Some(240));
        assert_eq!(policy.etag, "7");
        let mask = req.update_mask.expect("a mask").paths;
        assert_eq!(mask, ["max_items", "max_wait"]);
        assert_eq!(req.reason, "peak");
    }

    /// A field that does not parse is named, in the proto's names.
    #[test]
    fn a_bad_field_is_named() {
        let cases: [(&[u8], &str); 4] = [
            (br#"{"policy": {"maxWait": "soon"}}"#, "policy.max_wait"),
            (br#"{"policy": {"maxItems": "many"}}"#, "policy.max_items"),
            (br#"{"policy": {"maxItemz": 3}}"#, "policy"),
            (b"{", "body"),
        ];
        for (body, field) in cases {
            let status = from_json::<pb::UpdatePolicyRequest>(body).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            let message = status.message();
            assert!(message.starts_with(&format!("{field}:")), "{message}");
        }
    }
}
