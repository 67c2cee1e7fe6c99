//! The web view's Policies tab on a real service with `[policy_store]` on:
//! its JSON API with a plain HTTP client (409 for a stale etag, 400 naming
//! a bad field, 403 without the admin role, FAILED_PRECONDITION with the
//! store off), and the page in headless Chromium: the list, an edit, two
//! editors, and the history.

use std::net::SocketAddr;

use crate::support::browser::Browser;
use crate::support::{RedisServer, Service, config, eventually};
use batcher::pb;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

/// The policy the tests edit: areas of 20 parcels or 20 minutes, at most
/// 1 MiB, under defaults of 10 parcels or 1 hour.
const POLICIES: &str = r#"
[defaults]
max_items = 10
max_wait = "1h"

[keys."area-*"]
max_items = 20
max_wait = "20m"
max_bytes = "1MiB"

[policy_store]
enabled = true
check_every = "100ms"
"#;

/// The edited policy's name, and its card on the page.
const AREAS: &str = "policies/keys/area-*";
const CARD: &str = "document.querySelector(\"article.policy[data-name='policies/keys/area-*']\")";

/// The service on a fresh Redis with `text` as config; a client, once the
/// store has loaded (seeded from the file).
async fn start(text: &str) -> (RedisServer, Service, Client) {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), text)).await;
    let client = service.client().await;
    eventually("the policy store to load", || {
        let mut client = client.clone();
        async move { client.get_policy(get_req(AREAS)).await.ok() }
    })
    .await;
    (redis, service, client)
}

fn get_req(name: &str) -> tonic::Request<pb::GetPolicyRequest> {
    let name = name.to_owned();
    let mut request = tonic::Request::new(pb::GetPolicyRequest { name });
    let admin = tonic::metadata::MetadataValue::from_static("Bearer admin");
    request.metadata_mut().insert("authorization", admin);
    request
}

/// The areas' policy, read by gRPC.
async fn areas(client: &mut Client) -> pb::Policy {
    client
        .get_policy(get_req(AREAS))
        .await
        .unwrap()
        .into_inner()
}

/// Sets the areas' max_items to `n` by gRPC, as another editor would.
async fn set_max_items(client: &mut Client, n: u32, etag: &str) -> pb::Policy {
    let policy = pb::Policy {
        name: AREAS.into(),
        max_items: Some(n),
        etag: etag.into(),
        ..Default::default()
    };
    let mask = prost_types::FieldMask {
        paths: vec!["max_items".into()],
    };
    let req = pb::UpdatePolicyRequest {
        policy: Some(policy),
        update_mask: Some(mask),
        reason: "the other editor".into(),
    };
    let mut request = tonic::Request::new(req);
    let admin = tonic::metadata::MetadataValue::from_static("Bearer admin");
    request.metadata_mut().insert("authorization", admin);
    client.update_policy(request).await.unwrap().into_inner()
}

/// A request to `path` on `http` with `token`; its status and JSON body.
async fn call(
    http: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = client.request(method, format!("http://{http}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        let json = "application/json";
        request = request.header("content-type", json).body(body.to_string());
    }
    let response = request.send().await.expect("an HTTP answer");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, body)
}

/// Tokens `admin` (admin) and `reader` (read), named as their secrets.
fn auth_tables() -> String {
    [("admin", "admin"), ("reader", "read")]
        .iter()
        .map(|(name, role)| {
            let sha256 = format!("{:x}", Sha256::digest(name.as_bytes()));
            format!(
                "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{sha256}\"\nroles = [\"{role}\"]\n"
            )
        })
        .collect()
}

/// The error status name and message of an error body.
fn refusal(body: &Value) -> (&str, &str) {
    let error = &body["error"];
    let status = error["status"].as_str().unwrap_or_default();
    (status, error["message"].as_str().unwrap_or_default())
}

/// PATCH of the areas' policy on `http` with `token` and `body`.
async fn patch(http: SocketAddr, token: &str, body: Value) -> (u16, Value) {
    let path = "/api/policies/keys/area-*";
    call(http, "PATCH", path, Some(token), Some(body)).await
}

/// An UpdatePolicy body in the JSON mapping: max_items only, with `etag`.
fn max_items_edit(max_items: Value, etag: &str) -> Value {
    json!({"policy": {"maxItems": max_items, "etag": etag},
           "updateMask": "maxItems", "reason": "peak"})
}

/// Over HTTP, an edit with a stale etag is 409 (ETAG_MISMATCH) and writes
/// nothing; with the current etag it is the new policy (fields out of the
/// mask kept), listed, and in the history with the token and the reason.
#[tokio::test]
async fn a_stale_etag_is_409_and_writes_nothing() {
    let text = format!("{POLICIES}\n{}", auth_tables());
    let (_redis, service, mut client) = start(&text).await;
    let http = service.http_addr.expect("an http listener");
    let loaded = areas(&mut client).await;
    let other = set_max_items(&mut client, 40, &loaded.etag).await;
    let (status, body) = patch(http, "admin", max_items_edit(json!(30), &loaded.etag)).await;
    assert_eq!((status, refusal(&body).0), (409, "ABORTED"), "{body}");
    let reason = &body["error"]["details"][0]["reason"];
    assert_eq!(reason, "ETAG_MISMATCH", "{body}");
    let now = areas(&mut client).await;
    assert_eq!((now.max_items, now.revision), (Some(40), other.revision));

    let (status, saved) = patch(http, "admin", max_items_edit(json!(30), &other.etag)).await;
    assert_eq!(status, 200, "{saved}");
    assert_eq!(saved["maxItems"], 30);
    assert_eq!(saved["maxBytes"], "1048576", "fields out of the mask stay");
    let list = "/api/policies?prefix=area-";
    let (status, listed) = call(http, "GET", list, Some("reader"), None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["policies"][0]["revision"], saved["revision"],
        "{listed}"
    );
    let history = format!("/api/revisions?name={AREAS}&page_size=1");
    let (status, page) = call(http, "GET", &history, Some("reader"), None).await;
    assert_eq!(status, 200, "{page}");
    let latest = &page["revisions"][0];
    let said = (&latest["who"], &latest["reason"]);
    assert_eq!(said, (&json!("token admin"), &json!("peak")), "{page}");
    let field = &latest["changes"][0]["fields"][0];
    assert_eq!(
        (&field["oldValue"], &field["newValue"]),
        (&json!("40"), &json!("30"))
    );
    service.stop().await;
}

/// Over HTTP, a bad field is 400 naming it (in the message and in a
/// BadRequest detail), and an edit with a token without the admin role is
/// 403; neither writes anything.
#[tokio::test]
async fn a_bad_field_is_400_naming_it_and_a_reader_gets_403() {
    let text = format!("{POLICIES}\n{}", auth_tables());
    let (_redis, service, mut client) = start(&text).await;
    let http = service.http_addr.expect("an http listener");
    let loaded = areas(&mut client).await;
    let (status, body) = patch(http, "reader", max_items_edit(json!(30), &loaded.etag)).await;
    assert_eq!(
        (status, refusal(&body).0),
        (403, "PERMISSION_DENIED"),
        "{body}"
    );
    let (status, body) = patch(http, "admin", max_items_edit(json!(0), &loaded.etag)).await;
    assert_eq!(
        (status, refusal(&body).0),
        (400, "INVALID_ARGUMENT"),
        "{body}"
    );
    assert!(refusal(&body).1.starts_with("policy.max_items:"), "{body}");
    let violation = &body["error"]["details"][1]["fieldViolations"][0];
    assert_eq!(violation["field"], "policy.max_items", "{body}");
    let bad_wait = json!({"policy": {"maxWait": "soon"}, "updateMask": "maxWait"});
    let (status, body) = patch(http, "admin", bad_wait).await;
    assert_eq!(status, 400, "{body}");
    assert!(refusal(&body).1.starts_with("policy.max_wait:"), "{body}");
    let bad_overflow = json!({"policy": {"overflow": "sometimes"}, "updateMask": "overflow"});
    let (status, body) = patch(http, "admin", bad_overflow).await;
    assert_eq!(status, 400, "{body}");
    assert!(refusal(&body).1.starts_with("policy.overflow:"), "{body}");
    let now = areas(&mut client).await;
    assert_eq!((now.revision, now.max_items), (loaded.revision, Some(20)));
    service.stop().await;
}

/// With the policy store off, the policy API answers 400 with
/// FAILED_PRECONDITION, and the Policies tab says the store is off.
#[tokio::test]
async fn with_the_store_off_the_api_and_the_page_say_so() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let http = service.http_addr.expect("an http listener");
    let (status, body) = call(http, "GET", "/api/policies", None, None).await;
    let refused = (status, refusal(&body).0);
    assert_eq!(refused, (400, "FAILED_PRECONDITION"), "{body}");
    let mut browser = Browser::launch(1000, 600).await;
    browser.goto(&format!("http://{http}/#policies")).await;
    let off = "document.getElementById('policies-off')";
    let said = format!("!{off}.hidden && {off}.textContent");
    let said = browser
        .wait_for("the page to say the store is off", &said)
        .await;
    assert!(
        said.as_str()
            .unwrap()
            .starts_with("The policy store is off"),
        "{said}"
    );
    drop(browser);
    service.stop().await;
}

/// Opens the Policies tab of the service at `http` and waits for the areas'
/// card at `revision`.
async fn open_policies(http: SocketAddr, revision: u64) -> Browser {
    let mut browser = Browser::launch(1300, 900).await;
    browser.goto(&format!("http://{http}/#policies")).await;
    let at = format!("{CARD}?.dataset.revision === '{revision}'");
    browser
        .wait_for("the areas' card at its revision", &at)
        .await;
    browser
}

/// Opens the areas' edit form, fills `fields` (name, text) and `reason`,
/// and submits it, as a person would.
async fn submit_edit(browser: &mut Browser, fields: &[(&str, &str)], reason: &str) {
    let mut script = format!(
        "const card = {CARD}; card.querySelector('details.edit').open = true; \
         const form = card.querySelector('form.edit-form'); "
    );
    for (name, text) in fields.iter().chain([&("reason", reason)]) {
        script.push_str(&format!("form.elements[{name:?}].value = {text:?}; "));
    }
    script.push_str("form.requestSubmit(); true");
    browser.eval(&script).await;
}

/// The list shows each policy, the defaults first, with its revision, its
/// set fields in the config file's forms, and who last wrote it.
#[tokio::test]
async fn the_page_lists_each_policy_with_its_revision() {
    let (_redis, service, mut client) = start(POLICIES).await;
    let http = service.http_addr.expect("an http listener");
    let seeded = areas(&mut client).await;
    let mut browser = open_policies(http, seeded.revision).await;
    let names = "[...document.querySelectorAll('article.policy')].map(c => c.dataset.name)";
    assert_eq!(
        browser.eval(names).await,
        json!(["policies/defaults", AREAS])
    );
    let revision = browser
        .eval(&format!("{CARD}.querySelector('.revision').textContent"))
        .await;
    assert_eq!(revision, json!(format!("revision {}", seeded.revision)));
    let fields = format!(
        "[...{CARD}.querySelectorAll('.fields div')].map(d => `${{d.dataset.field}}=${{d.querySelector('dd').textContent}}`)"
    );
    let fields = browser.eval(&fields).await;
    assert_eq!(
        fields,
        json!(["max_items=20", "max_wait=20m", "max_bytes=1 MiB"])
    );
    let by = browser
        .eval(&format!("{CARD}.querySelector('.updated').textContent"))
        .await;
    assert!(by.as_str().unwrap().starts_with("by config file"), "{by}");
    drop(browser);
    service.stop().await;
}

/// An edit through the page's form (text boxes, and a menu for overflow)
/// sends only the changed fields in the mask, with the etag it loaded; the
/// policy changes (new values and a new revision, read by gRPC), and its
/// history shows the edit: its reason, and each field's old and new value.
#[tokio::test]
async fn an_edit_through_the_page_changes_the_policy_and_shows_in_its_history() {
    let (_redis, service, mut client) = start(POLICIES).await;
    let http = service.http_addr.expect("an http listener");
    let before = areas(&mut client).await;
    let mut browser = open_policies(http, before.revision).await;
    let record = "window.sent = []; const send = window.fetch; \
                  window.fetch = (url, init) => { if (init?.body) sent.push(JSON.parse(init.body)); \
                  return send(url, init); }; true";
    browser.eval(record).await;
    let edit = [
        ("max_items", "30"),
        ("max_wait", "5m"),
        ("max_groups", "500"),
        ("overflow", "flush_oldest"),
    ];
    submit_edit(&mut browser, &edit, "peak season").await;
    let saved = format!("{CARD}?.querySelector('.form-status.saved')?.textContent");
    let saved = browser.wait_for("the edit to be saved", &saved).await;

    let after = areas(&mut client).await;
    assert_eq!(after.max_items, Some(30));
    assert_eq!(after.max_wait.map(|d| d.seconds), Some(300));
    assert_eq!(after.max_bytes, Some(1 << 20), "a field left alone stays");
    assert_eq!(after.max_groups, Some(500));
    assert_eq!(after.overflow.as_deref(), Some("flush_oldest"));
    assert!(after.revision > before.revision, "{after:?}");
    assert_eq!(
        saved,
        json!(format!("Saved as revision {}.", after.revision))
    );
    let sent = browser.eval("window.sent").await;
    let body = &sent[0];
    let mask = "maxItems,maxWait,maxGroups,overflow";
    assert_eq!(body["updateMask"], mask, "{sent}");
    assert_eq!(body["policy"]["etag"], before.etag.as_str(), "{sent}");
    assert_eq!(body["policy"]["maxItems"], 30, "{sent}");

    let open = format!("{CARD}.querySelector('details.history').open = true; true");
    browser.eval(&open).await;
    let entry = format!(
        "{CARD}?.querySelector(\"li.revision-entry[data-revision='{}']\")",
        after.revision
    );
    let changes = format!("{entry}?.querySelector('.changes')?.children.length === 4");
    browser.wait_for("the edit in the history", &changes).await;
    let text =
        |part: &str| format!("[...{entry}.querySelectorAll('{part}')].map(e => e.textContent)");
    assert_eq!(browser.eval(&text(".reason")).await, json!(["peak season"]));
    let changed = browser.eval(&text(".change")).await;
    let want = [
        "max_items: 20 → 30",
        "max_wait: 20m → 5m",
        "max_groups: unset → 500",
        "overflow: unset → flush_oldest",
    ];
    assert_eq!(changed, json!(want));
    let who = browser.eval(&text(".who")).await;
    assert!(
        who[0].as_str().unwrap().starts_with("peer 127.0.0.1:"),
        "{who}"
    );
    drop(browser);
    service.stop().await;
}

/// Two editors: a form loaded before someone else changed the policy is
/// refused (409) when submitted; the page says the policy changed
/// meanwhile and shows it as it is now, and the policy keeps the other
/// editor's change, untouched by the form.
#[tokio::test]
async fn a_form_loaded_before_another_edit_is_refused_and_reloaded() {
    let (_redis, service, mut client) = start(POLICIES).await;
    let http = service.http_addr.expect("an http listener");
    let loaded = areas(&mut client).await;
    let mut browser = open_policies(http, loaded.revision).await;
    let etag = format!("{CARD}.querySelector('form.edit-form').dataset.etag");
    assert_eq!(browser.eval(&etag).await, json!(loaded.etag));

    let other = set_max_items(&mut client, 40, &loaded.etag).await;
    submit_edit(
        &mut browser,
        &[("max_items", "30"), ("max_wait", "5m")],
        "mine",
    )
    .await;
    let conflict = format!("{CARD}?.querySelector('.form-status.conflict')?.textContent");
    let said = browser
        .wait_for("the conflict to be shown", &conflict)
        .await;
    assert!(
        said.as_str()
            .unwrap()
            .contains("changed by someone else meanwhile"),
        "{said}"
    );

    let now = areas(&mut client).await;
    assert_eq!((now.revision, now.max_items), (other.revision, Some(40)));
    assert_eq!(
        now.max_wait.map(|d| d.seconds),
        Some(1200),
        "the form wrote nothing"
    );
    let form = format!("{CARD}.querySelector('form.edit-form')");
    let shown = format!(
        "[{CARD}.dataset.revision, {form}.dataset.etag, {form}.elements.max_items.value, \
         {form}.elements.max_wait.value, {form}.elements.reason.value]"
    );
    let shown = browser.eval(&shown).await;
    let revision = other.revision.to_string();
    assert_eq!(shown, json!([revision, other.etag, "40", "20m", ""]));
    drop(browser);
    service.stop().await;
}
