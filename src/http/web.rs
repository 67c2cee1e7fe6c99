//! The live web view's page, `GET /`: one HTML page, its script and its
//! style sheet, compiled into the binary (`include_str!` of the files in
//! `web/`), with no build step. The page reads everything it shows from the
//! JSON API (`api`), which needs a token with the `read` role when auth is
//! on; the assets themselves hold no data, so they are served to anyone.

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::get;

/// The page.
const INDEX_HTML: &str = include_str!("web/index.html");
/// The page's script: plain modern JavaScript (fetch, EventSource).
const APP_JS: &str = include_str!("web/app.js");
/// The page's style sheet.
const STYLE_CSS: &str = include_str!("web/style.css");

/// `GET /`, `/app.js` and `/style.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
}

/// One asset. `no-cache`: the browser revalidates, so an upgraded binary's
/// page is seen at once.
async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
}
