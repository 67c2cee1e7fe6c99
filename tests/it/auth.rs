//! Bearer tokens on a real service and a real Redis: each role's allowed
//! and refused methods, key scopes on Add, AddMany, ListGroups and Subscribe
//! (live and durable), UNAUTHENTICATED for a missing or unknown token,
//! nothing written on a refusal, health and reflection open without a
//! token, SIGHUP adding and removing tokens, and the warning for an open port.

use crate::support;

use std::collections::BTreeSet;

use crate::support::{
    RedisServer, Service, add, assert_error_info, channel, eventually, next_batch,
};
use batcher::cli::Bearer;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use batcher_testkit::{AddrLine, Spawn};
use sha2::{Digest, Sha256};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Every Batcher method, by the name in its path.
const METHODS: [&str; 10] = [
    "Add",
    "AddMany",
    "Remove",
    "Flush",
    "GetGroup",
    "ListGroups",
    "Subscribe",
    "Ack",
    "ListDeadLetters",
    "Redrive",
];

/// The tokens of the tests: (name = secret, roles, key prefixes).
const TOKENS: [(&str, &str, &str); 6] = [
    ("producer", "\"produce\"", ""),
    ("consumer", "\"consume\"", ""),
    ("reader", "\"read\"", ""),
    ("admin", "\"admin\"", ""),
    ("both", "\"produce\", \"read\"", ""),
    (
        "berlin",
        "\"produce\", \"consume\", \"read\"",
        "\"berlin-\", \"potsdam-\"",
    ),
];

/// The hex SHA-256 of `secret`, as the config takes it.
fn sha256(secret: &str) -> String {
    format!("{:x}", Sha256::digest(secret.as_bytes()))
}

/// `[[auth.tokens]]` entries for `tokens`; each token's secret is its name.
fn auth_toml(tokens: &[(&str, &str, &str)]) -> String {
    let entry = |(name, roles, prefixes): &(&str, &str, &str)| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [{roles}]\n\
             key_prefixes = [{prefixes}]\n",
            sha256(name)
        )
    };
    tokens.iter().map(entry).collect()
}

/// Config text for a service over `redis` with `tokens`.
fn config_text(redis: &RedisServer, tokens: &[(&str, &str, &str)]) -> String {
    let extra = format!(
        "[defaults]\nmax_items = 100\nmax_wait = \"1h\"\n[http]\nlisten = \"127.0.0.1:0\"\n{}",
        auth_toml(tokens)
    );
    support::config_text(&redis.url(), &extra)
}

type Client = BatcherClient<InterceptedService<Channel, Bearer>>;

/// A client of `addr` that sends `token` (none with `None`).
async fn client(addr: std::net::SocketAddr, token: Option<&str>) -> Client {
    let channel = channel(addr);
    let value = token.map(|t| format!("Bearer {t}").parse().unwrap());
    BatcherClient::with_interceptor(channel, Bearer(value))
}

/// Calls `method` with a valid request on `key`; Ok when the call is served.
async fn call(client: &mut Client, method: &str, key: &str) -> Result<(), Status> {
    let group = || "g".to_owned();
    match method {
        "Add" => client.add(add(key, "1", b"x")).await.map(drop),
        "AddMany" => {
            let items = vec![add(key, "2", b"y")];
            client
                .add_many(pb::AddManyRequest { items })
                .await
                .map(drop)
        }
        "Remove" => {
            let (key, item_id) = (key.into(), "1".into());
            client
                .remove(pb::RemoveRequest { key, item_id })
                .await
                .map(drop)
        }
        "Flush" => client
            .flush(pb::FlushRequest { key: key.into() })
            .await
            .map(drop),
        "GetGroup" => client
            .get_group(pb::GetGroupRequest { key: key.into() })
            .await
            .map(drop),
        "ListGroups" => client
            .list_groups(pb::ListGroupsRequest::default())
            .await
            .map(drop),
        "Subscribe" => client
            .subscribe(pb::SubscribeRequest::default())
            .await
            .map(drop),
        "Ack" => {
            let request = pb::AckRequest {
                consumer_group: group(),
                batch_ids: Vec::new(),
            };
            client.ack(request).await.map(drop)
        }
        "ListDeadLetters" => {
            let request = pb::ListDeadLettersRequest {
                consumer_group: group(),
                page_size: 0,
                ..Default::default()
            };
            client.list_dead_letters(request).await.map(drop)
        }
        "Redrive" => {
            let request = pb::RedriveRequest {
                consumer_group: group(),
                batch_ids: Vec::new(),
            };
            client.redrive(request).await.map(drop)
        }
        other => panic!("no such method {other}"),
    }
}

/// The methods each test token may call.
fn allowed(token: &str) -> &'static [&'static str] {
    const PRODUCE: [&str; 3] = ["Add", "AddMany", "Remove"];
    match token {
        "producer" => &PRODUCE,
        "consumer" => &["Subscribe", "Ack"],
        "reader" => &["GetGroup", "ListGroups"],
        "admin" => &METHODS,
        "both" => &["Add", "AddMany", "Remove", "GetGroup", "ListGroups"],
        other => panic!("no such token {other}"),
    }
}

/// The role a method needs: the one whose test token may call it (the
/// admin token may call every method, and the rest only with it).
fn role_of(method: &str) -> &'static str {
    [
        ("producer", "produce"),
        ("consumer", "consume"),
        ("reader", "read"),
    ]
    .into_iter()
    .find(|(token, _)| allowed(token).contains(&method))
    .map_or("admin", |(_, role)| role)
}

/// Each role may call exactly its methods: the others fail PERMISSION_DENIED
/// with ROLE_MISSING naming the role and method, and write nothing (the
/// refused calls all run before any allowed one).
#[tokio::test]
async fn each_role_calls_its_methods_only() {
    let redis = RedisServer::start();
    let config = batcher::config::Config::parse(&config_text(&redis, &TOKENS), "t.toml").unwrap();
    let service = Service::start(config).await;
    let tokens = ["producer", "consumer", "reader", "admin", "both"];
    for token in tokens {
        let mut client = client(service.addr, Some(token)).await;
        for method in METHODS.iter().filter(|m| !allowed(token).contains(m)) {
            let status = call(&mut client, method, "k").await.unwrap_err();
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{token} {method}: {status:?}"
            );
            let meta = assert_error_info(&status, "ROLE_MISSING");
            assert_eq!(meta["method"], *method, "{meta:?}");
            assert_eq!(meta["role"], role_of(method), "{token} {method}: {meta:?}");
        }
    }
    assert_eq!(redis.data_keys(), "0", "a refused call wrote");
    for token in tokens {
        let mut client = client(service.addr, Some(token)).await;
        for method in allowed(token) {
            let served = call(&mut client, method, "k").await;
            assert!(served.is_ok(), "{token} may call {method}: {served:?}");
        }
    }
    service.stop().await;
}

/// No token, a token of another scheme, or an unknown one: UNAUTHENTICATED
/// with TOKEN_MISSING or TOKEN_UNKNOWN, on every method, and nothing
/// written. Health and reflection answer without a token.
#[tokio::test]
async fn missing_or_unknown_token_is_unauthenticated() {
    let redis = RedisServer::start();
    let config = batcher::config::Config::parse(&config_text(&redis, &TOKENS), "t.toml").unwrap();
    let service = Service::start(config).await;
    let basic = Bearer(Some("Basic YWRtaW4=".parse().unwrap()));
    let cases = [
        (client(service.addr, None).await, "TOKEN_MISSING"),
        (
            BatcherClient::with_interceptor(channel(service.addr), basic),
            "TOKEN_MISSING",
        ),
        (
            client(service.addr, Some("not-a-token")).await,
            "TOKEN_UNKNOWN",
        ),
        // The digest itself is not the token.
        (
            client(service.addr, Some(&sha256("admin"))).await,
            "TOKEN_UNKNOWN",
        ),
    ];
    for (mut client, reason) in cases {
        for method in METHODS {
            let status = call(&mut client, method, "k").await.unwrap_err();
            assert_eq!(status.code(), Code::Unauthenticated, "{method}: {status:?}");
            assert_error_info(&status, reason);
        }
    }
    assert_eq!(redis.data_keys(), "0", "a refused call wrote");

    support::wait_health(
        service.addr,
        tonic_health::pb::health_check_response::ServingStatus::Serving,
    )
    .await;
    assert_eq!(
        reflected_services(service.addr).await,
        [
            "batcher.v1.Batcher",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ]
    );
    service.stop().await;
}

/// The services that server reflection lists at `addr`, asked without a token.
async fn reflected_services(addr: std::net::SocketAddr) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut client = ServerReflectionClient::new(channel(addr));
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection answers without a token")
        .into_inner();
    let reply = replies.message().await.unwrap().expect("a reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("not a service list: {reply:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    names
}

/// Asserts that `result` is PERMISSION_DENIED with KEY_OUT_OF_SCOPE naming `key`.
#[track_caller]
fn assert_out_of_scope<T: std::fmt::Debug>(result: Result<T, Status>, key: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let meta = assert_error_info(&status, "KEY_OUT_OF_SCOPE");
    assert_eq!(meta["key"], key, "{meta:?}");
}

/// A scoped token touches only keys under its prefixes: Add, AddMany (all
/// or nothing), Remove, Flush and GetGroup outside them are
/// PERMISSION_DENIED and write nothing; ListGroups lists only its prefixes,
/// page by page, and refuses a prefix outside them.
#[tokio::test]
async fn key_scopes_limit_writes_and_listings() {
    let redis = RedisServer::start();
    let config = batcher::config::Config::parse(&config_text(&redis, &TOKENS), "t.toml").unwrap();
    let service = Service::start(config).await;
    let mut admin = client(service.addr, Some("admin")).await;
    let mut berlin = client(service.addr, Some("berlin")).await;
    for key in ["berlin-1", "potsdam-1", "hamburg-1"] {
        admin.add(add(key, "a", b"")).await.unwrap();
    }
    let keys = redis.data_keys();
    for method in ["Add", "AddMany", "Remove", "GetGroup"] {
        assert_out_of_scope(call(&mut berlin, method, "hamburg-1").await, "hamburg-1");
    }
    let items = vec![add("berlin-2", "b", b""), add("hamburg-2", "b", b"")];
    assert_out_of_scope(
        berlin.add_many(pb::AddManyRequest { items }).await,
        "hamburg-2",
    );
    assert_eq!(redis.data_keys(), keys, "a refused call wrote");
    let size = async |key: &str| {
        let req = pb::GetGroupRequest { key: key.into() };
        let group = admin
            .clone()
            .get_group(req)
            .await
            .unwrap()
            .into_inner()
            .group;
        group.map(|g| g.size)
    };
    assert_eq!(size("berlin-2").await, None);
    assert_eq!(size("hamburg-1").await, Some(1));

    berlin.add(add("berlin-2", "b", b"")).await.unwrap();
    let items = vec![add("berlin-3", "c", b""), add("potsdam-3", "c", b"")];
    berlin.add_many(pb::AddManyRequest { items }).await.unwrap();
    let listed = |prefix: &str, page_size| pb::ListGroupsRequest {
        key_prefix: prefix.into(),
        page_size,
        page_token: String::new(),
    };
    let mut seen = BTreeSet::new();
    let mut request = listed("", 1);
    loop {
        let page = berlin
            .list_groups(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(page.groups.len() <= 1);
        seen.extend(page.groups.into_iter().map(|g| g.key));
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    let want = ["berlin-1", "berlin-2", "berlin-3", "potsdam-1", "potsdam-3"];
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), want);
    let page = berlin
        .list_groups(listed("potsdam-", 0))
        .await
        .unwrap()
        .into_inner();
    let keys: BTreeSet<String> = page.groups.into_iter().map(|g| g.key).collect();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["potsdam-1", "potsdam-3"]
    );
    for prefix in ["hamburg-", "ber"] {
        assert_out_of_scope(berlin.list_groups(listed(prefix, 0)).await, prefix);
    }
    service.stop().await;
}

/// A scoped token's Subscribe sees only its prefixes: an empty filter gets
/// its own keys and no others, a filter outside them is refused, it may not
/// join a consumer group over other keys (nor ack for it), and a group it
/// creates with an empty filter covers its prefixes only.
#[tokio::test]
async fn scoped_subscribe_sees_only_its_prefixes() {
    let redis = RedisServer::start();
    let config = batcher::config::Config::parse(&config_text(&redis, &TOKENS), "t.toml").unwrap();
    let service = Service::start(config).await;
    let mut admin = client(service.addr, Some("admin")).await;
    let mut berlin = client(service.addr, Some("berlin")).await;
    let live = pb::SubscribeRequest::default();
    let mut batches = berlin.subscribe(live.clone()).await.unwrap().into_inner();
    let durable = |group: &str| pb::SubscribeRequest {
        consumer_group: group.into(),
        consumer: "c1".into(),
        after: "0".into(),
        ..Default::default()
    };
    let mut all = admin.subscribe(durable("all")).await.unwrap().into_inner();
    let mut mine = berlin
        .subscribe(durable("mine"))
        .await
        .unwrap()
        .into_inner();
    for key in ["hamburg-1", "berlin-1"] {
        admin.add(add(key, "a", b"")).await.unwrap();
        admin
            .flush(pb::FlushRequest { key: key.into() })
            .await
            .unwrap();
    }
    // hamburg-1 was flushed first: had it passed the filter, it would come first.
    assert_eq!(next_batch(&mut batches).await.key, "berlin-1");
    assert_eq!(next_batch(&mut mine).await.key, "berlin-1");
    assert_eq!(next_batch(&mut all).await.key, "hamburg-1");

    let filtered = |keys: &[&str], prefixes: &[&str]| pb::SubscribeRequest {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        key_prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        ..Default::default()
    };
    assert_out_of_scope(
        berlin.subscribe(filtered(&["hamburg-1"], &[])).await,
        "hamburg-1",
    );
    assert_out_of_scope(berlin.subscribe(filtered(&[], &["ber"])).await, "ber");
    berlin
        .subscribe(filtered(&["berlin-9"], &["potsdam-"]))
        .await
        .unwrap();

    let status = berlin.subscribe(durable("all")).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        assert_error_info(&status, "KEY_OUT_OF_SCOPE")["consumer_group"],
        "all"
    );
    let ack = pb::AckRequest {
        consumer_group: "all".into(),
        batch_ids: Vec::new(),
    };
    assert_eq!(
        berlin.ack(ack).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let ack = pb::AckRequest {
        consumer_group: "mine".into(),
        batch_ids: Vec::new(),
    };
    berlin.ack(ack).await.unwrap();
    service.stop().await;
}

/// SIGHUP reloads the tokens: a token added to the file is accepted and one
/// removed is refused TOKEN_UNKNOWN, without a restart; the log never holds
/// a token; removing the whole [auth] table keeps the tokens in force.
#[tokio::test]
async fn sighup_adds_and_removes_tokens() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, config_text(&redis, &TOKENS[..1])).unwrap();
    let process = support::serve(&path, dir.path()).start().await;
    let mut old = client(process.addr, Some("producer")).await;
    let mut new = client(process.addr, Some("reader")).await;
    call(&mut old, "Add", "k").await.unwrap();
    let status = call(&mut new, "GetGroup", "k").await.unwrap_err();
    assert_error_info(&status, "TOKEN_UNKNOWN");

    std::fs::write(&path, config_text(&redis, &TOKENS[2..3])).unwrap();
    process.signal(libc::SIGHUP);
    eventually("the new token to be accepted", || {
        let mut new = new.clone();
        async move { call(&mut new, "GetGroup", "k").await.ok() }
    })
    .await;
    let status = call(&mut old, "Add", "k").await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_error_info(&status, "TOKEN_UNKNOWN");
    let log = process.log();
    assert!(log.contains("auth tokens reloaded"), "{log}");
    for (secret, _, _) in TOKENS {
        assert!(!log.contains(&format!("Bearer {secret}")), "{log}");
    }

    // Removing the whole [auth] table does not open the port before a restart.
    std::fs::write(&path, config_text(&redis, &[])).unwrap();
    process.signal(libc::SIGHUP);
    eventually("the removal of [auth] to be refused", || {
        let refused = process.log().contains("[auth] was removed");
        async move { refused.then_some(()) }
    })
    .await;
    let mut anonymous = client(process.addr, None).await;
    let status = call(&mut anonymous, "GetGroup", "k").await.unwrap_err();
    assert_error_info(&status, "TOKEN_MISSING");
    call(&mut new, "GetGroup", "k").await.unwrap();
}

/// With no [auth], a service listening beyond loopback warns at start-up
/// that anyone who reaches the port may call every method.
#[tokio::test]
async fn open_port_without_auth_warns() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, config_text(&redis, &[])).unwrap();
    let log = dir.path().join("batcher.log");
    // Bound by the process itself, so no probe can race another bind.
    let serving = AddrLine::Event("serving".into());
    let process = Spawn::new(env!("CARGO_BIN_EXE_batcher"), log, serving)
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--listen", "0.0.0.0:0"])
        .env("RUST_LOG", "info")
        .bound()
        .await;
    eventually("the open-port warning", || async {
        process.log().contains("auth is off").then_some(())
    })
    .await;
}
