//! The live web view on a real service and a real Redis: the JSON API with a
//! plain HTTP client (groups by page and prefix, batches as Server-Sent
//! Events, tokens and roles), and the page itself in headless Chromium,
//! showing the open groups and the batches as they flush. The browser test
//! saves a screenshot at `target/web-view.png`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::support::browser::Browser;
use crate::support::scrape::scrape;
use crate::support::{DEADLINE, RedisServer, Service, add, config, config_text, process_with};
use batcher::pb;
use serde_json::Value;
use sha2::{Digest, Sha256};

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

/// Areas of 10 parcels or 1 hour, hubs by weight too, express keys that
/// leave after 2 seconds, and vans that leave after 3 idle minutes.
const POLICIES: &str = r#"
[defaults]
max_items = 10
max_wait = "1h"

[keys."hub-*"]
max_items = 12
max_wait = "20m"
capacity = { weight_g = 20000 }

[keys."express-*"]
max_wait = "2s"

[keys."van-*"]
max_wait = "1h"
max_idle = "3m"
"#;

/// An HTTP client that never goes through a proxy.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client")
}

/// GET `path` on `http`, with `token` as a bearer token; the status and
/// the JSON body.
async fn get(http: SocketAddr, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = http_client().get(format!("http://{http}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, body)
}

/// Adds one item of `weight_g` grams under `key`.
async fn add_weighed(client: &mut Client, key: &str, id: &str, weight_g: u64) {
    let mut req = add(key, id, format!("parcel {id}").as_bytes());
    if let Some(item) = req.item.as_mut() {
        item.measures.insert("weight_g".into(), weight_g);
    }
    client.add(req).await.expect("add");
}

/// A live `GET /api/batches`, read line by line.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// Opens `path` and waits for its first line (the stream's opening
    /// comment), so that batches flushed from then on are delivered.
    async fn open(http: SocketAddr, path: &str) -> Events {
        let response = http_client()
            .get(format!("http://{http}{path}"))
            .send()
            .await
            .expect("GET /api/batches");
        assert_eq!(response.status(), 200);
        let content_type = &response.headers()["content-type"];
        assert_eq!(content_type, "text/event-stream");
        let mut events = Events {
            response,
            buffer: String::new(),
        };
        assert_eq!(events.line().await, ": live");
        events
    }

    /// The next line of the stream.
    async fn line(&mut self) -> String {
        loop {
            if let Some(end) = self.buffer.find('\n') {
                let line = self.buffer[..end].to_owned();
                self.buffer.drain(..=end);
                return line;
            }
            let chunk = tokio::time::timeout(DEADLINE, self.response.chunk())
                .await
                .expect("no event within the deadline")
                .expect("the event stream failed")
                .expect("the event stream ended");
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// Waits until the server ends the stream.
    async fn ended(&mut self) {
        loop {
            let chunk = tokio::time::timeout(DEADLINE, self.response.chunk())
                .await
                .expect("the event stream did not end within the deadline");
            if !matches!(chunk, Ok(Some(_))) {
                return;
            }
        }
    }

    /// The next batch event: its id and its data.
    async fn batch(&mut self) -> (String, Value) {
        let mut id = String::new();
        loop {
            let line = self.line().await;
            if let Some(value) = line.strip_prefix("id: ") {
                id = value.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                return (id, serde_json::from_str(data).expect("a batch in JSON"));
            }
        }
    }
}

/// `GET /api/groups` pages through ListGroups by `page_size` and
/// `page_token`, filters by `prefix`, speaks the protobuf JSON mapping, and
/// answers 400 with the gRPC message for a bad query.
#[tokio::test]
async fn groups_are_listed_by_page_and_prefix() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), POLICIES)).await;
    let http = service.http_addr.expect("an http listener");
    let mut client = service.client().await;
    for i in 0..25 {
        client
            .add(add(&format!("area-{i:02}"), "p1", b"x"))
            .await
            .unwrap();
    }
    for i in 0..5 {
        add_weighed(&mut client, &format!("hub-{i}"), "p1", 1500).await;
    }

    let mut keys = Vec::new();
    let mut token = String::new();
    loop {
        let path = format!("/api/groups?prefix=area-&page_size=10&page_token={token}");
        let (status, page) = get(http, &path, None).await;
        assert_eq!(status, 200, "{page}");
        let groups = page["groups"].as_array().cloned().unwrap_or_default();
        assert!(groups.len() <= 10, "{page}");
        keys.extend(groups.iter().map(|g| g["key"].as_str().unwrap().to_owned()));
        match page["nextPageToken"].as_str() {
            Some(next) => token = next.to_owned(),
            None => break,
        }
    }
    keys.sort();
    let want: Vec<_> = (0..25).map(|i| format!("area-{i:02}")).collect();
    assert_eq!(keys, want);

    let (_, hubs) = get(http, "/api/groups?prefix=hub-", None).await;
    let hub = &hubs["groups"][0];
    assert_eq!(hubs["groups"].as_array().unwrap().len(), 5);
    assert_eq!(hub["size"], 1);
    assert_eq!(hub["maxItems"], 12);
    assert_eq!(hub["measures"]["weight_g"], "1500");
    assert_eq!(hub["capacity"]["weight_g"], "20000");
    assert_eq!(hub["dueReason"], "FLUSH_REASON_TIMEOUT");
    assert!(hub["dueAt"].as_str().unwrap().ends_with('Z'), "{hub}");
    let (_, all) = get(http, "/api/groups?page_size=1000", None).await;
    assert_eq!(all["groups"].as_array().unwrap().len(), 30);

    for (query, field) in [
        ("page_size=-1", "page_size"),
        ("page_token=nonsense", "page_token"),
        ("page_size=many", "page_size"),
    ] {
        let (status, body) = get(http, &format!("/api/groups?{query}"), None).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{query}: {message}");
    }
    service.stop().await;
}

/// `GET /api/batches` streams each flushed batch under its prefix as one
/// `data:` line in the JSON mapping, with its cursor as the event id, and
/// leaves out other keys; the service's shutdown ends the stream.
#[tokio::test]
async fn batches_stream_as_server_sent_events() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), POLICIES)).await;
    let http = service.http_addr.expect("an http listener");
    let mut client = service.client().await;
    client.add(add("area-1", "p1", b"one")).await.unwrap();
    client.add(add("area-1", "p2", b"two")).await.unwrap();
    client.add(add("other-1", "p1", b"x")).await.unwrap();

    let mut events = Events::open(http, "/api/batches?prefix=area-").await;
    let flush = |key: &str| pb::FlushRequest { key: key.into() };
    client.flush(flush("other-1")).await.unwrap();
    client.flush(flush("area-1")).await.unwrap();
    let (id, batch) = events.batch().await;
    assert_eq!(batch["key"], "area-1");
    assert_eq!(batch["reason"], "FLUSH_REASON_MANUAL");
    assert_eq!(batch["items"][0]["id"], "p1");
    assert_eq!(batch["items"][1]["id"], "p2");
    assert_eq!(batch["cursor"], id.as_str());
    // Shutdown ends the stream instead of waiting on it.
    service.stop().await;
    events.ended().await;
}

/// The tokens of the auth tests: (name = secret, roles, key prefixes).
const TOKENS: [(&str, &str, &str); 4] = [
    ("admin", "\"admin\"", ""),
    ("reader", "\"read\"", ""),
    ("producer", "\"produce\"", ""),
    ("berlin", "\"read\", \"produce\"", "\"berlin-\""),
];

/// A config over `redis` with POLICIES and the `[[auth.tokens]]` of TOKENS.
fn auth_config(redis: &RedisServer) -> batcher::config::Config {
    let text = auth_config_text(redis);
    let mut config = batcher::config::Config::parse(&text, "test.toml").expect("config");
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config
}

/// The text of [`auth_config`], for a config file.
fn auth_config_text(redis: &RedisServer) -> String {
    let auth: String = TOKENS
        .iter()
        .map(|(name, roles, prefixes)| {
            let sha256 = format!("{:x}", Sha256::digest(name.as_bytes()));
            format!(
                "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{sha256}\"\n\
                 roles = [{roles}]\nkey_prefixes = [{prefixes}]\n"
            )
        })
        .collect();
    config_text(&redis.url(), &format!("{POLICIES}\n{auth}"))
}

/// With `[auth]` the API needs a token with the `read` role, from the
/// `authorization` header or the `token` parameter: 401 without one or
/// with an unknown one, 403 for a token without `read` or a prefix out of
/// its scope. The page's assets need none. Refused calls are counted in
/// `batcher_requests_total` under the gRPC method the API calls.
#[tokio::test]
async fn the_api_needs_a_read_token_when_auth_is_on() {
    let redis = RedisServer::start();
    // A child process has a metrics recorder of its own: the refusals
    // counted are this test's, whatever other tests of the binary call.
    let dir = tempfile::tempdir().unwrap();
    let mut process = process_with(dir.path(), &auth_config_text(&redis)).await;
    let http = process.http_addr().await;
    let before = scrape(http).await;

    let (status, body) = get(http, "/api/groups", None).await;
    assert_eq!(
        (status, &body["error"]["status"]),
        (401, &"UNAUTHENTICATED".into())
    );
    assert_eq!(get(http, "/api/groups", Some("nobody")).await.0, 401);
    let (status, body) = get(http, "/api/groups", Some("producer")).await;
    assert_eq!(
        (status, &body["error"]["status"]),
        (403, &"PERMISSION_DENIED".into())
    );
    assert_eq!(get(http, "/api/groups", Some("reader")).await.0, 200);
    assert_eq!(get(http, "/api/groups?token=reader", None).await.0, 200);
    assert_eq!(
        get(http, "/api/groups?prefix=paris-", Some("berlin"))
            .await
            .0,
        403
    );
    assert_eq!(
        get(http, "/api/groups?prefix=berlin-1", Some("berlin"))
            .await
            .0,
        200
    );

    let refused = http_client()
        .get(format!("http://{http}/api/batches"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    Events::open(http, "/api/batches?token=reader").await;
    let scoped = "/api/batches?token=berlin&prefix=paris-";
    let refused = http_client().get(format!("http://{http}{scoped}")).send();
    assert_eq!(refused.await.unwrap().status(), 403);
    let after = scrape(http).await;
    let refusals = |method, code| {
        let labels = [("method", method), ("code", code)];
        after.delta(&before, "batcher_requests_total", &labels)
    };
    assert_eq!(refusals("ListGroups", "UNAUTHENTICATED"), 2.0);
    assert_eq!(refusals("ListGroups", "PERMISSION_DENIED"), 2.0);
    assert_eq!(refusals("Subscribe", "UNAUTHENTICATED"), 1.0);
    assert_eq!(refusals("Subscribe", "PERMISSION_DENIED"), 1.0);

    for (path, kind) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/style.css", "text/css"),
    ] {
        let response = http_client()
            .get(format!("http://{http}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
    }
    process.stop().await;
}

/// Where the browser test leaves its screenshot: `target/web-view.png`.
fn screenshot_path() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().expect("the target dir").join("web-view.png")
}

/// The number of group rows on the page.
const ROWS: &str = "document.querySelectorAll('#groups tbody tr[data-key]').length";

/// A JavaScript test that an element matches `selector`.
fn shown(selector: &str) -> String {
    format!("!!document.querySelector({selector:?})")
}

/// Opens 11 groups, filled to different levels: six hubs weighed against
/// their capacity, four areas, and one van due by its idle time.
async fn open_groups(client: &mut Client) {
    let hubs = [
        "berlin", "potsdam", "leipzig", "dresden", "hamburg", "bremen",
    ];
    for (i, hub) in hubs.iter().enumerate() {
        for n in 0..=(i * 2) {
            let weight_g = 300 + 150 * n as u64;
            add_weighed(client, &format!("hub-{hub}"), &format!("p{n}"), weight_g).await;
        }
    }
    for (i, area) in ["north", "south", "east", "west"].iter().enumerate() {
        for n in 0..=(i * 2) {
            let req = add(&format!("area-{area}"), &format!("p{n}"), b"parcel");
            client.add(req).await.unwrap();
        }
    }
    for n in 0..4 {
        let req = add("van-charlottenburg", &format!("p{n}"), b"parcel");
        client.add(req).await.unwrap();
    }
}

/// Filters the page by `prefix`, as a person would with the form.
async fn filter(browser: &mut Browser, prefix: &str) {
    let submit = format!(
        "document.getElementById('prefix').value = {prefix:?}; \
         document.getElementById('filter').requestSubmit(); true"
    );
    browser.eval(&submit).await;
}

/// Flushes `key` by a Flush call.
async fn flush(client: &mut Client, key: &str) {
    let req = pb::FlushRequest { key: key.into() };
    client.flush(req).await.expect("flush");
}

/// In headless Chromium the page shows the open groups (size, capacity,
/// countdown, due reason), fills a group's bar as items arrive, filters by
/// prefix, and shows batches live as they flush, by a Flush call, by size
/// and by timeout; it leaves a screenshot at `target/web-view.png`.
#[tokio::test]
async fn the_page_shows_groups_filling_and_batches_flushing_live() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), POLICIES)).await;
    let http = service.http_addr.expect("an http listener");
    let mut client = service.client().await;
    open_groups(&mut client).await;

    let mut browser = Browser::launch(1400, 900).await;
    browser.goto(&format!("http://{http}/")).await;
    browser
        .wait_for("the 11 group rows", &format!("{ROWS} === 11"))
        .await;
    let van = "tr[data-key='van-charlottenburg'] .reason-idle";
    browser
        .wait_for("the van due by idle time", &shown(van))
        .await;

    filter(&mut browser, "area-").await;
    let only_areas = format!(
        "{ROWS} === 4 && [...document.querySelectorAll('#groups tbody tr')]\
         .every(row => row.dataset.key.startsWith('area-'))"
    );
    browser.wait_for("only the area rows", &only_areas).await;
    filter(&mut browser, "").await;
    browser
        .wait_for("the 11 rows again", &format!("{ROWS} === 11"))
        .await;
    let live = "document.body.dataset.feed === 'live'";
    browser.wait_for("the live feed", live).await;

    // A group fills: its bar follows within a refresh.
    add_weighed(&mut client, "hub-berlin", "late", 2000).await;
    let meter = "document.querySelector('tr[data-key=\"hub-berlin\"] [role=meter]')";
    let filled = format!("{meter}?.getAttribute('aria-valuenow') === '2'");
    browser.wait_for("hub-berlin's bar at 2", &filled).await;

    // Batches flush: by a Flush call, by size, by timeout.
    flush(&mut client, "hub-potsdam").await;
    add_weighed(&mut client, "hub-bremen", "p11", 100).await; // its 12th item
    client
        .add(add("express-spandau", "p1", b"urgent"))
        .await
        .unwrap();
    flush(&mut client, "hub-leipzig").await;
    for (key, reason) in [
        ("hub-potsdam", "manual"),
        ("hub-bremen", "size"),
        ("express-spandau", "timeout"),
        ("hub-leipzig", "manual"),
    ] {
        let entry = format!("#feed li[data-key='{key}'].reason-{reason}");
        let what = format!("{key}'s {reason} batch in the feed");
        browser.wait_for(&what, &shown(&entry)).await;
    }
    let count = "document.querySelector(\"#feed li[data-key='hub-bremen'] .count\").textContent";
    let count = browser.eval(count).await;
    assert!(count.as_str().unwrap().starts_with("12 items"), "{count}");
    // The flushed groups leave the table at its next refresh.
    browser
        .wait_for("the 8 rows left open", &format!("{ROWS} === 8"))
        .await;

    let path = screenshot_path();
    browser.screenshot(&path).await;
    assert!(std::fs::metadata(&path).expect("the screenshot").len() > 10_000);
    drop(browser);
    service.stop().await;
}

/// The countdowns run by the service's clock: with the browser's clock an
/// hour fast, a group due in an hour still shows 59 minutes, not "due now".
#[tokio::test]
async fn countdowns_follow_the_services_clock_not_the_browsers() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), POLICIES)).await;
    let http = service.http_addr.expect("an http listener");
    let mut client = service.client().await;
    client
        .add(add("area-north", "p1", b"parcel"))
        .await
        .unwrap();

    let mut browser = Browser::launch(1000, 600).await;
    let fast = "const realNow = Date.now; Date.now = () => realNow() + 3600000;";
    let params = serde_json::json!({ "source": fast });
    browser.call("Page.enable", serde_json::json!({})).await;
    browser
        .call("Page.addScriptToEvaluateOnNewDocument", params)
        .await;
    browser.goto(&format!("http://{http}/")).await;
    let cell = "document.querySelector(\"tr[data-key='area-north'] td.due\")?.textContent";
    let shown = browser
        .wait_for(
            "area-north's countdown",
            &format!("{cell} !== '' && {cell}"),
        )
        .await;
    let shown = shown.as_str().unwrap().to_owned();
    assert!(
        shown.starts_with("59m") || shown.starts_with("1h 00m"),
        "a group due in an hour shows {shown:?}"
    );
    let skewed = browser.eval("Date.now() - new Date().getTime()").await;
    assert!(
        skewed.as_f64().unwrap() > 3_000_000.0,
        "the browser's clock is fast"
    );
    drop(browser);
    service.stop().await;
}

/// `message` as a call with the admin token.
fn as_admin<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let token = tonic::metadata::MetadataValue::from_static("Bearer admin");
    request.metadata_mut().insert("authorization", token);
    request
}

/// With `[auth]` the page asks for a token when the API answers 401, and
/// with a `read` token it shows the groups and the batches live.
#[tokio::test]
async fn the_page_asks_for_a_token_when_auth_is_on() {
    let redis = RedisServer::start();
    let config = auth_config(&redis);
    let service = Service::start(config).await;
    let http = service.http_addr.expect("an http listener");
    let mut client = service.client().await;
    for key in ["berlin-1", "berlin-2"] {
        client
            .add(as_admin(add(key, "p1", b"parcel")))
            .await
            .unwrap();
    }

    let mut browser = Browser::launch(1200, 800).await;
    browser.goto(&format!("http://{http}/")).await;
    let asked = "!document.getElementById('login').hidden";
    browser.wait_for("the page to ask for a token", asked).await;
    let submit = "document.getElementById('token').value = 'reader'; \
                  document.getElementById('login').requestSubmit(); true";
    browser.eval(submit).await;
    browser
        .wait_for("the 2 group rows", &format!("{ROWS} === 2"))
        .await;
    let live = "document.body.dataset.feed === 'live'";
    browser.wait_for("the live feed", live).await;
    let flush = pb::FlushRequest {
        key: "berlin-2".into(),
    };
    client.flush(as_admin(flush)).await.expect("flush");
    let entry = shown("#feed li[data-key='berlin-2'].reason-manual");
    browser
        .wait_for("berlin-2's batch in the feed", &entry)
        .await;
    drop(browser);
    service.stop().await;
}
