//! The web view's JSON API, served by calling the in-process gRPC service, so
//! that its checks (tokens, roles, key scopes, validation, paging) are
//! exactly those of gRPC:
//! - `GET /api/groups?prefix=&page_size=&page_token=`: one page of
//!   ListGroups, as its `ListGroupsResponse` in the protobuf JSON mapping
//!   (`{"groups": [...], "nextPageToken": "..."}`), with the service's clock
//!   in an `x-batcher-now` header (Unix ms) for the page's countdowns.
//! - `GET /api/batches?prefix=`: a live Subscribe as Server-Sent Events, one
//!   `data:` line per batch (its `Batch` in the JSON mapping), the batch's
//!   cursor as the event id (a reconnecting `EventSource` sends it back as
//!   `Last-Event-ID` and misses nothing still retained; a cursor trimmed
//!   meanwhile resumes from now), and keep-alives. A failed subscription
//!   sends an `error` event with the JSON error body and ends the stream;
//!   so does the service's shutdown.
//!
//! Both are counted in `batcher_requests_total` under the gRPC method they
//! call.
//!
//! With `[auth]`, both need a token with the `read` role (or `admin`): the
//! feed only watches, it never acks, so it needs no `consume`. The token's
//! key prefixes narrow both, as they narrow ListGroups and Subscribe. The
//! token is read from `authorization: Bearer <token>` or, because an
//! `EventSource` cannot set headers, from a `token` query parameter. A
//! refusal is the gRPC status mapped to its HTTP status (Google's HTTP
//! mapping of `google.rpc.Code`, with 400 for CANCELLED's unofficial 499)
//! and a JSON body
//! `{"error": {"code", "status", "message", "details"}}`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Code, Status};

use crate::auth::Auth;
use crate::json::to_json;
use crate::metrics::{code_name, record_call};
use crate::pb;
use crate::pb::batcher_server::Batcher;
use crate::service::BatcherService;

/// The method whose role the groups and the feed need: `read`
/// (ListGroups's). The feed of batches is reading too: it never acks, so it
/// needs no `consume`.
const ROLE_OF: &str = "ListGroups";

/// How often an idle event stream sends a keep-alive comment, so proxies and
/// browsers keep it open.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);

/// What the API handlers share: the gRPC service they call, the tokens in
/// force, the deadline of one call, and the token that ends event streams
/// at shutdown.
#[derive(Clone)]
pub struct Api {
    pub service: BatcherService,
    pub auth: Auth,
    /// The most a ListGroups (or a Subscribe's start) may take, as the gRPC
    /// port's `[redis] response_timeout`.
    pub deadline: Duration,
    /// Cancelled at shutdown: the event streams end, so the listener's
    /// graceful stop does not wait on them.
    pub shutdown: CancellationToken,
    /// What `GET /readyz` reports.
    pub readiness: crate::drain::Readiness,
}

/// The header of a `GET /api/groups` reply that holds the service's clock
/// (Unix ms), so that the page counts down to due times by the service's
/// clock, not by the browser's, which may be far off.
pub const NOW_HEADER: &str = "x-batcher-now";

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

/// The query of a paged listing by key prefix (`GET /api/groups`,
/// `GET /api/policies`).
#[derive(Deserialize)]
pub struct PageQuery {
    #[serde(default)]
    pub(super) prefix: String,
    #[serde(default)]
    pub(super) page_size: i32,
    #[serde(default)]
    pub(super) page_token: String,
    pub(super) token: Option<String>,
}

/// The query of `GET /api/batches`.
#[derive(Deserialize)]
pub struct BatchesQuery {
    #[serde(default)]
    prefix: String,
    token: Option<String>,
}

/// `GET /api/groups`.
pub async fn groups(
    State(api): State<Api>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return error(&Status::invalid_argument(rejection.body_text())),
    };
    let request = pb::ListGroupsRequest {
        page_size: query.page_size,
        page_token: query.page_token,
        key_prefix: query.prefix,
    };
    let started = Instant::now();
    let listed = async {
        let request = api.request(ROLE_OF, &headers, query.token.as_deref(), request)?;
        api.within_deadline(api.service.list_groups(request)).await
    }
    .await;
    let code = listed.as_ref().map_or_else(Status::code, |_| Code::Ok);
    record_call("ListGroups", code, started);
    match listed {
        Ok(response) => {
            let mut reply = Json(to_json(&response.into_inner())).into_response();
            reply.headers_mut().insert(NOW_HEADER, now_ms().into());
            reply
        }
        Err(status) => error(&status),
    }
}

/// `GET /api/batches`.
pub async fn batches(
    State(api): State<Api>,
    headers: HeaderMap,
    query: Result<Query<BatchesQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return error(&Status::invalid_argument(rejection.body_text())),
    };
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let subscribe = |after: String| pb::SubscribeRequest {
        key_prefixes: match query.prefix.is_empty() {
            true => Vec::new(),
            false => vec![query.prefix.clone()],
        },
        after,
        ..Default::default()
    };
    let token = query.token.as_deref();
    let started = Instant::now();
    let mut subscribed = api
        .subscribe(&headers, token, subscribe(last_event_id))
        .await;
    // A resume cursor that has been trimmed meanwhile: carry on from now.
    if matches!(&subscribed, Err(s) if s.code() == Code::InvalidArgument) {
        subscribed = api
            .subscribe(&headers, token, subscribe(String::new()))
            .await;
    }
    let code = subscribed.as_ref().map_or_else(Status::code, |_| Code::Ok);
    record_call("Subscribe", code, started);
    match subscribed {
        Ok(stream) => {
            let events = stream.take_until(api.shutdown.clone().cancelled_owned());
            Sse::new(events)
                .keep_alive(KeepAlive::new().interval(KEEP_ALIVE_EVERY))
                .into_response()
        }
        Err(status) => error(&status),
    }
}

/// Where an API call comes from: its headers (with the bearer token), the
/// `token` query parameter, and the browser's address, when known (the
/// policy history names it when auth is off).
pub struct Sender<'a> {
    headers: &'a HeaderMap,
    token: Option<&'a str>,
    peer: Option<SocketAddr>,
}

impl<'a> Sender<'a> {
    pub fn new(headers: &'a HeaderMap, token: Option<&'a str>, peer: Option<SocketAddr>) -> Self {
        Sender {
            headers,
            token,
            peer,
        }
    }
}

impl Api {
    /// Calls the gRPC method `method` (by `call`) with `message` from
    /// `from`, within the deadline, and counts it in
    /// `batcher_requests_total`: its reply in the JSON mapping, or its
    /// refusal. The token is checked before the message, so a caller
    /// without one learns nothing from a bad body.
    pub async fn answer<M, R, Fut>(
        &self,
        method: &'static str,
        from: Sender<'_>,
        message: Result<M, Status>,
        call: impl FnOnce(BatcherService, tonic::Request<M>) -> Fut,
    ) -> Response
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
        R: prost::Name,
    {
        let started = Instant::now();
        let answered = async {
            let mut request = self.request(method, from.headers, from.token, ())?;
            if let Some(addr) = from.peer {
                let info = TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some(addr),
                };
                request.extensions_mut().insert(info);
            }
            let message = message?;
            let request = request.map(|()| message);
            self.within_deadline(call(self.service.clone(), request))
                .await
        }
        .await;
        let code = answered.as_ref().map_or_else(Status::code, |_| Code::Ok);
        record_call(method, code, started);
        match answered {
            Ok(response) => Json(to_json(&response.into_inner())).into_response(),
            Err(status) => error(&status),
        }
    }

    /// `message` as a gRPC request from the caller that the bearer token in
    /// `headers` (or else `token`) names, once its roles allow `method`.
    fn request<T>(
        &self,
        method: &str,
        headers: &HeaderMap,
        token: Option<&str>,
        message: T,
    ) -> Result<tonic::Request<T>, Status> {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let authorization = match headers.get(header::AUTHORIZATION) {
            Some(value) => Some(value.as_bytes()),
            None => bearer.as_deref().map(str::as_bytes),
        };
        let caller = self.auth.check(method, authorization)?;
        let mut request = tonic::Request::new(message);
        if let Some(caller) = caller {
            request.extensions_mut().insert(caller);
        }
        Ok(request)
    }

    /// `call`, or UNAVAILABLE once the deadline has passed.
    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(Status::unavailable(format!(
                "no answer from redis within {}",
                humantime::format_duration(self.deadline)
            ))),
        }
    }

    /// A live Subscribe as a stream of SSE events; a failure of the
    /// subscription is sent as an `error` event, and ends the stream.
    async fn subscribe(
        &self,
        headers: &HeaderMap,
        token: Option<&str>,
        message: pb::SubscribeRequest,
    ) -> Result<impl Stream<Item = Result<Event, Infallible>> + use<>, Status> {
        let request = self.request(ROLE_OF, headers, token, message)?;
        let batches = self
            .within_deadline(self.service.subscribe(request))
            .await?
            .into_inner();
        // A comment first, so the browser sees the stream open at once.
        let opened = futures::stream::once(async { Ok(Event::default().comment("live")) });
        let events = batches.scan(false, |failed, batch| {
            let event = match (*failed, batch) {
                (true, _) => return futures::future::ready(None),
                (false, Ok(batch)) => Event::default()
                    .id(batch.cursor.clone())
                    .data(to_json(&batch).to_string()),
                (false, Err(status)) => {
                    *failed = true;
                    Event::default()
                        .event("error")
                        .data(error_body(&status).to_string())
                }
            };
            futures::future::ready(Some(Ok(event)))
        });
        Ok(opened.chain(events))
    }
}

/// Each gRPC code and the HTTP status it maps to.
const CODES: [(Code, StatusCode); 17] = [
    (Code::Ok, StatusCode::OK),
    (Code::Cancelled, StatusCode::BAD_REQUEST),
    (Code::Unknown, StatusCode::INTERNAL_SERVER_ERROR),
    (Code::InvalidArgument, StatusCode::BAD_REQUEST),
    (Code::DeadlineExceeded, StatusCode::GATEWAY_TIMEOUT),
    (Code::NotFound, StatusCode::NOT_FOUND),
    (Code::AlreadyExists, StatusCode::CONFLICT),
    (Code::PermissionDenied, StatusCode::FORBIDDEN),
    (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
    (Code::FailedPrecondition, StatusCode::BAD_REQUEST),
    (Code::Aborted, StatusCode::CONFLICT),
    (Code::OutOfRange, StatusCode::BAD_REQUEST),
    (Code::Unimplemented, StatusCode::NOT_IMPLEMENTED),
    (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
    (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
    (Code::DataLoss, StatusCode::INTERNAL_SERVER_ERROR),
    (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
];

/// The name and HTTP status of `code`.
fn code_parts(code: Code) -> (&'static str, StatusCode) {
    let (code, http) = CODES.iter().find(|(c, _)| *c == code).unwrap_or(&CODES[2]);
    (code_name(*code), *http)
}

/// `status` as an HTTP response.
pub fn error(status: &Status) -> Response {
    let (_, http) = code_parts(status.code());
    let mut response = (http, Json(error_body(status))).into_response();
    if http == StatusCode::UNAUTHORIZED {
        let challenge = header::HeaderValue::from_static("Bearer");
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// The JSON error body of `status`, in the shape of Google's JSON errors;
/// its `ErrorInfo` (reason and metadata) and `BadRequest` (the fields at
/// fault), when it has them, are details.
fn error_body(status: &Status) -> serde_json::Value {
    use tonic_types::StatusExt;
    let (name, http) = code_parts(status.code());
    let info = status.get_details_error_info().map(|info| {
        serde_json::json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": info.reason,
            "domain": info.domain,
            "metadata": info.metadata,
        })
    });
    let bad = status.get_details_bad_request().map(|bad| {
        let violations: Vec<_> = bad
            .field_violations
            .iter()
            .map(|v| serde_json::json!({"field": v.field, "description": v.description}))
            .collect();
        serde_json::json!({
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": violations,
        })
    });
    let details: Vec<_> = info.into_iter().chain(bad).collect();
    serde_json::json!({
        "error": {
            "code": http.as_u16(),
            "status": name,
            "message": status.message(),
            "details": details,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refusals map to the HTTP statuses a client expects.
    #[test]
    fn grpc_codes_map_to_http_statuses() {
        let cases = [
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::InvalidArgument, 400),
            (Code::Unavailable, 503),
            (Code::ResourceExhausted, 429),
            (Code::Internal, 500),
        ];
        for (code, http) in cases {
            assert_eq!(code_parts(code).1.as_u16(), http, "{code:?}");
        }
        let body = error_body(&Status::permission_denied("no"));
        assert_eq!(body["error"]["status"], "PERMISSION_DENIED");
        assert_eq!(body["error"]["code"], 403);
        assert_eq!(body["error"]["message"], "no");
    }
}
