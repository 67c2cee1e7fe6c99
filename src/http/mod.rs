//! The HTTP listener (`[http]`), one axum [`Router`]:
//! - `GET /metrics`: the Prometheus text format (no token needed);
//! - `GET /readyz`: 200 while this instance should get traffic (Redis
//!   answers, no drain has begun), else 503, as gRPC health reports it;
//!   `GET /livez`: 200 while the process serves (no token needed);
//! - `GET /` (with `/app.js` and `/style.css`): the live web view (`web`),
//!   served to anyone, since it holds no data;
//! - `GET /api/groups` and `GET /api/batches` (Server-Sent Events): the
//!   view's JSON API (`api`), which calls the in-process gRPC service, so
//!   with `[auth]` on it needs a token with the `read` (or `admin`) role,
//!   and keeps to the token's key prefixes;
//! - `GET /api/policies`, `GET` and `PATCH /api/policies/{name}`, and
//!   `GET /api/revisions`: the policies and their history (`policies`),
//!   the same way (changing needs `admin`).

mod api;
mod policies;
mod web;

use std::net::SocketAddr;

use std::io;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use self::api::{Api, KEEP_ALIVE_EVERY};
use crate::config::HttpConfig;

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds the listener of `[http]`, or none when it is disabled.
pub async fn bind(config: &HttpConfig) -> io::Result<Option<TcpListener>> {
    if !config.enabled {
        return Ok(None);
    }
    TcpListener::bind(config.listen).await.map(Some)
}

/// Every route of the HTTP listener; `api` serves the web view's JSON API.
pub fn routes(api: Api) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/api/groups", get(api::groups))
        .route("/api/batches", get(api::batches))
        .route("/api/policies", get(policies::list))
        .route(
            "/api/policies/{*name}",
            get(policies::get).patch(policies::update),
        )
        .route("/api/revisions", get(policies::revisions))
        .with_state(api)
        .merge(web::routes())
}

/// Serves `routes` on `listener` until `shutdown`; requests under way then
/// finish. Each request knows its peer's address (the policy history names
/// it when auth is off). A failure is logged: metrics and the web view are
/// not worth stopping the service for.
pub async fn serve(listener: TcpListener, routes: Router, shutdown: CancellationToken) {
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, "serving http (GET /metrics, the web view at /)"),
        Err(err) => tracing::warn!(%err, "http listener has no local address"),
    }
    let routes = routes.into_make_service_with_connect_info::<SocketAddr>();
    let served = axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await;
    if let Err(err) = served {
        tracing::error!(%err, "http listener failed; /metrics and the web view are down");
    }
}

/// `GET /readyz`: 200 `ready`, or 503 `not ready` (Redis does not answer,
/// or the instance drains).
async fn readyz(State(api): State<Api>) -> impl IntoResponse {
    match api.readiness.is_ready() {
        true => (StatusCode::OK, "ready\n"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
    }
}

/// `GET /livez`: 200 while the process serves HTTP, drain or not.
async fn livez() -> &'static str {
    "live\n"
}

/// `GET /metrics`.
async fn metrics() -> impl IntoResponse {
    ([(CONTENT_TYPE, PROMETHEUS_TEXT)], crate::metrics::render())
}
