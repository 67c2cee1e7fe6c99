//! The live web view's page, `GET /`: one HTML page, its script and its
//! style sheet, compiled into the binary (`include_str!` of the files in
//! `web/`), with no build step. The page reads everything it shows from the
//! JSON API (`api`), which needs a token with the `read` role when auth is
//! on; the assets themselves hold no data, so they are served to anyone.
//!
//! The page shows one page of open groups at a time (soonest due first, 100
//! by default, Previous and Next by page token, the page in view refreshed
//! every 2 seconds), so it stays quick with any number of groups: for each
//! its key, a bar of its size against `max_items`, its bytes, a bar per
//! capacity measure, and a countdown to its due time with the rule that set
//! it. Beside it, the batches flushing (newest first, the last 50, one
//! colour per reason), and a filter by key prefix for both. When the API
//! answers 401 the page asks for a token and keeps it in the tab's
//! `sessionStorage`. Countdowns run by the service's clock (the
//! `x-batcher-now` header), whatever the browser's clock says.
//!
//! Its Policies tab (`#policies`, `policies.js`) lists the policy store's
//! policies (revision, set fields, last writer), with an edit form per
//! policy that sends only the changed fields, guarded by the etag it
//! loaded, and each policy's history.

use axum::Router;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::response::IntoResponse;
use axum::routing::get;

/// The page.
const INDEX_HTML: &str = include_str!("web/index.html");
/// The page's script: plain modern JavaScript (fetch, EventSource).
const APP_JS: &str = include_str!("web/app.js");
/// The Policies tab's script (after `app.js`, whose helpers it uses).
const POLICIES_JS: &str = include_str!("web/policies.js");
/// The page's style sheet.
const STYLE_CSS: &str = include_str!("web/style.css");

/// `GET /`, `/app.js`, `/policies.js` and `/style.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/policies.js",
            get(|| asset("text/javascript; charset=utf-8", POLICIES_JS)),
        )
        .route(
            "/style.css",
            get(|| asset("text/css; charset=utf-8", STYLE_CSS)),
        )
}

/// What the page may load: its own assets and API, nothing else.
const POLICY: &str = "default-src 'self'; frame-ancestors 'none'";

/// One asset. `no-cache`: the browser revalidates, so an upgraded binary's
/// page is seen at once.
async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    let headers = [
        (CONTENT_TYPE, content_type),
        (CACHE_CONTROL, "no-cache"),
        (CONTENT_SECURITY_POLICY, POLICY),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (headers, body)
}
