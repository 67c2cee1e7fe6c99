//! The HTTP listener (`[http]`): `GET /metrics` in the Prometheus text
//! format. Its routes are one axum [`Router`], so further pages join it as
//! routes of their own.

use std::io;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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

/// Every route of the HTTP listener.
pub fn routes() -> Router {
    Router::new().route("/metrics", get(metrics))
}

/// Serves `routes` on `listener` until `shutdown`; requests under way then
/// finish. A failure is logged: metrics are not worth stopping the service for.
pub async fn serve(listener: TcpListener, routes: Router, shutdown: CancellationToken) {
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, "serving http (GET /metrics)"),
        Err(err) => tracing::warn!(%err, "http listener has no local address"),
    }
    let served = axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await;
    if let Err(err) = served {
        tracing::error!(%err, "http listener failed; /metrics is down");
    }
}

/// `GET /metrics`.
async fn metrics() -> impl IntoResponse {
    ([(CONTENT_TYPE, PROMETHEUS_TEXT)], crate::metrics::render())
}
