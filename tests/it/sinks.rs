//! Sinks against a real HTTP receiver started here and a real Redis: signed
//! webhooks (checked with an HMAC computed here), retries, `Retry-After`,
//! dead letters and redrive, order per key under concurrency, a killed
//! instance, and a sink added by SIGHUP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use batcher::pb;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::{self, RedisServer, Service, add, eventually};

/// One request the receiver got, and what it answered.
#[derive(Clone, Debug)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
    key: String,
    status: u16,
    /// When the answer went out.
    at: Instant,
}

/// How the receiver answers the `n`th request (1-based) for a webhook id:
/// status, extra headers, body, and how long it waits first.
type Answer =
    dyn Fn(&str, usize) -> (u16, Vec<(&'static str, String)>, String, Duration) + Send + Sync;

#[derive(Default)]
struct Seen {
    log: Vec<Received>,
    /// The webhook-id of every request as it arrives (the log has those
    /// answered: a request its client gave up on is never answered).
    arrivals: Vec<String>,
    in_flight: HashMap<String, usize>,
    /// Set when two requests of one key overlapped.
    overlap: bool,
}

/// A webhook receiver on 127.0.0.1:0.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    answer: Arc<Mutex<Arc<Answer>>>,
}

impl Receiver {
    async fn start(answer: Arc<Answer>) -> Receiver {
        Receiver::start_with(answer, None).await
    }

    /// Over TLS with `tls` when given.
    async fn start_with(answer: Arc<Answer>, tls: Option<rustls::ServerConfig>) -> Receiver {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let answer = Arc::new(Mutex::new(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (s, a) = (seen.clone(), answer.clone());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (seen, answer) = (s.clone(), a.clone());
                async move { receive(seen, answer, headers, body).await }
            }),
        );
        match tls {
            None => tokio::spawn(async move { axum::serve(listener, app).await }),
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
                let listener = TlsListener { listener, acceptor };
                tokio::spawn(async move { axum::serve(listener, app).await })
            }
        };
        Receiver { addr, seen, answer }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn set(&self, answer: Arc<Answer>) {
        *self.answer.lock().unwrap() = answer;
    }

    fn log(&self) -> Vec<Received> {
        self.seen.lock().unwrap().log.clone()
    }

    /// Waits until `id` has been answered 2xx, and returns the log then.
    async fn wait_accepted(&self, id: &str) -> Vec<Received> {
        eventually(&format!("batch {id} to be accepted"), || {
            let log = self.log();
            let done = log.iter().any(|r| r.id == id && r.status < 300);
            async move { done.then_some(log) }
        })
        .await
    }
}

/// A TCP listener whose connections complete a TLS handshake first; one
/// that fails it is dropped.
struct TlsListener {
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            let Ok((tcp, peer)) = self.listener.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

async fn receive(
    seen: Arc<Mutex<Seen>>,
    answer: Arc<Mutex<Arc<Answer>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let id = header("webhook-id");
    let key = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["key"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let (n, answer) = {
        let mut seen = seen.lock().unwrap();
        let n = 1 + seen.arrivals.iter().filter(|a| **a == id).count();
        seen.arrivals.push(id.clone());
        let flying = seen.in_flight.entry(key.clone()).or_default();
        *flying += 1;
        if *flying > 1 {
            seen.overlap = true;
        }
        (n, answer.lock().unwrap().clone())
    };
    let (status, extra, text, delay) = answer(&id, n);
    tokio::time::sleep(delay).await;
    let mut out = HeaderMap::new();
    for (name, value) in extra {
        out.insert(name, value.parse().unwrap());
    }
    let mut seen = seen.lock().unwrap();
    *seen.in_flight.entry(key.clone()).or_default() -= 1;
    seen.log.push(Received {
        id,
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: body.to_vec(),
        key,
        status,
        at: Instant::now(),
    });
    (StatusCode::from_u16(status).unwrap(), out, text)
}

fn always(status: u16) -> Arc<Answer> {
    Arc::new(move |_, _| (status, vec![], String::new(), Duration::ZERO))
}

/// The Standard Webhooks signature of a request, computed here.
fn signature(secret: &[u8], r: &Received) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{}.{}.", r.id, r.timestamp).as_bytes());
    mac.update(&r.body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The secret the tests sign with, and its `whsec_` form.
const SECRET: &[u8] = b"test-secret-0123456789";
const OLD_SECRET: &[u8] = b"the-previous-secret";

fn whsec(secret: &[u8]) -> String {
    format!("whsec_{}", STANDARD.encode(secret))
}

/// One batch per add; a sink `name` to `url` signing with the secret in
/// `dir`, with `options` added to its options table.
fn sink_toml(dir: &Path, name: &str, url: &str, options: &str) -> String {
    let secret = dir.join(format!("{name}.secret"));
    std::fs::write(&secret, format!("{}\n", whsec(SECRET))).unwrap();
    format!(
        "[[sinks]]\nname = \"{name}\"\nkind = \"webhook\"\nlease = \"1s\"\n\
         [sinks.options]\nurl = \"{url}\"\nsecret_file = \"{}\"\n\
         backoff_min = \"20ms\"\nbackoff_max = \"200ms\"\n{options}\n",
        secret.display()
    )
}

const ONE_PER_BATCH: &str = "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n";

/// The service in-process with `sinks` (TOML), once each sink's group exists.
async fn start(redis: &RedisServer, sinks: &str, names: &[&str]) -> Service {
    let config = support::config(&redis.url(), &format!("{ONE_PER_BATCH}{sinks}"));
    let store = support::store(&config);
    let service = Service::start(config).await;
    for name in names {
        wait_group(&store, name).await;
    }
    service
}

async fn wait_group(store: &batcher::store::Store, name: &str) {
    eventually(&format!("sink {name}'s group to exist"), || async {
        store
            .consumer_group(&format!("sink.{name}"))
            .await
            .ok()
            .flatten()
    })
    .await;
}

/// Adds one item under `key`; the id of the batch it flushed.
async fn flush(
    client: &mut batcher::pb::batcher_client::BatcherClient<tonic::transport::Channel>,
    key: &str,
    item: &str,
) -> String {
    let reply = client
        .add(add(key, item, b"{}"))
        .await
        .unwrap()
        .into_inner();
    reply.flushed.expect("max_items = 1 flushes").id
}

/// Batches the sink's group holds pending, over the tests' 4 shards.
fn pending(redis: &RedisServer, sink: &str) -> usize {
    (0..4)
        .map(|shard| {
            let out = redis.cli(&[
                "XPENDING",
                &support::stream_key(shard),
                &format!("sink.{sink}"),
            ]);
            out.lines()
                .next()
                .and_then(|l| l.trim().parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum()
}

async fn wait_acked(redis: &RedisServer, sink: &str) {
    eventually("the sink's group to hold nothing pending", || {
        let n = pending(redis, sink);
        async move { (n == 0).then_some(()) }
    })
    .await;
}

/// A batch is POSTed with webhook-id = its batch id and a signature that
/// verifies with the secret (and with either one during a rotation), its
/// body the API's JSON, and it is acked once accepted.
#[tokio::test]
async fn signed_delivery_with_rotation() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(always(204)).await;
    let old = dir.path().join("old.secret");
    std::fs::write(&old, whsec(OLD_SECRET)).unwrap();
    let options = format!("previous_secret_file = \"{}\"", old.display());
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), &options);
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "parcel-1").await;
    let log = receiver.wait_accepted(&id).await;
    let r = log.iter().find(|r| r.id == id).unwrap();
    let signatures: Vec<&str> = r.signature.split(' ').collect();
    assert_eq!(signatures, [signature(SECRET, r), signature(OLD_SECRET, r)]);
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["key"], "north");
    assert_eq!(body["items"][0]["id"], "parcel-1");
    let ts: u64 = r.timestamp.parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(ts.abs_diff(now) < 60, "webhook-timestamp {ts} is now");
    wait_acked(&redis, "tms").await;
    service.stop().await;
}

/// An https receiver whose certificate a private CA signed, and which
/// requires a client certificate of that CA: the sink trusts `ca_file` and
/// presents `client_cert_file`, and the batch is delivered.
#[tokio::test]
async fn https_with_a_private_ca_and_a_client_certificate() {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = support::tls::Certs::generate(dir.path());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&certs.ca_file).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&certs.cert_file).unwrap()],
            PrivateKeyDer::from_pem_file(&certs.key_file).unwrap(),
        )
        .unwrap();
    let receiver = Receiver::start_with(always(200), Some(server)).await;
    let (cert, key) = certs.client_pem("batcher");
    let (cert_file, key_file) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let options = format!(
        "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
        certs.ca_file.display(),
        cert_file.display(),
        key_file.display()
    );
    let url = receiver.url().replace("http://", "https://");
    let sinks = sink_toml(dir.path(), "tms", &url, &options);
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    receiver.wait_accepted(&id).await;
    wait_acked(&redis, "tms").await;
    service.stop().await;
}

/// 5xx twice, then 2xx: three attempts with one webhook-id, then acked.
#[tokio::test]
async fn server_errors_are_retried_with_the_same_id() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, n| {
        let status = if n <= 2 { 503 } else { 200 };
        (status, vec![], String::new(), Duration::ZERO)
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    let log = receiver.wait_accepted(&id).await;
    let statuses: Vec<u16> = log
        .iter()
        .filter(|r| r.id == id)
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [503, 503, 200]);
    wait_acked(&redis, "tms").await;
    service.stop().await;
}

/// An attempt that outlasts `timeout` is retried, with the same id; the
/// retry's 2xx acks the batch.
#[tokio::test]
async fn a_timeout_is_retried() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, n| {
        let delay = if n == 1 {
            Duration::from_secs(2)
        } else {
            Duration::ZERO
        };
        (200, vec![], String::new(), delay)
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "timeout = \"300ms\"");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    receiver.wait_accepted(&id).await;
    wait_acked(&redis, "tms").await;
    let arrivals = receiver.seen.lock().unwrap().arrivals.clone();
    assert_eq!(arrivals, [id.clone(), id.clone()], "one retry, same id");
    assert_eq!(receiver.log().len(), 1, "the first request was given up on");
    service.stop().await;
}

/// A batch that fails `max_attempts` times goes to the dead letters with
/// the last status and answer, and is not tried again.
#[tokio::test]
async fn max_attempts_dead_letters() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, n| {
        (503, vec![], format!("down {n}"), Duration::ZERO)
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "max_attempts = 3");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    let store = support::store(&support::config(&redis.url(), ""));
    let why = eventually("the batch to be dead-lettered", || {
        let (store, id) = (store.clone(), id.clone());
        async move { store.sink_failure("sink.tms", &id).await.ok().flatten() }
    })
    .await;
    assert_eq!(why, "status 503: down 3");
    wait_acked(&redis, "tms").await;
    assert_eq!(receiver.log().len(), 3);
    service.stop().await;
}

/// A 429 with `Retry-After: 2` is retried no sooner than two seconds later,
/// though the backoff alone would retry within 200 ms.
#[tokio::test]
async fn retry_after_is_honoured() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, n| match n {
        1 => (
            429,
            vec![("retry-after", "2".to_owned())],
            String::new(),
            Duration::ZERO,
        ),
        _ => (200, vec![], String::new(), Duration::ZERO),
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    let log = receiver.wait_accepted(&id).await;
    let tries: Vec<&Received> = log.iter().filter(|r| r.id == id).collect();
    assert_eq!(tries.len(), 2);
    let gap = tries[1].at - tries[0].at;
    assert!(gap >= Duration::from_millis(1900), "retried after {gap:?}");
    service.stop().await;
}

/// A 400 dead-letters the batch at once, keeping the status and the body's
/// excerpt; Redrive sends it again with the same webhook-id.
#[tokio::test]
async fn refusal_dead_letters_and_redrive_delivers() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, _| {
        (400, vec![], "unknown depot".to_owned(), Duration::ZERO)
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut client = service.client().await;
    let id = flush(&mut client, "north", "p1").await;
    let dead = eventually("the batch to be dead-lettered", || {
        let mut client = client.clone();
        async move {
            let request = pb::ListDeadLettersRequest {
                consumer_group: "sink.tms".into(),
                ..Default::default()
            };
            let page = client.list_dead_letters(request).await.ok()?.into_inner();
            (!page.batches.is_empty()).then_some(page.batches)
        }
    })
    .await;
    assert_eq!(
        dead.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert_eq!(receiver.log().len(), 1, "a 400 is not retried");
    let store = support::store(&support::config(&redis.url(), ""));
    let why = store.sink_failure("sink.tms", &id).await.unwrap();
    assert_eq!(why.as_deref(), Some("status 400: unknown depot"));

    receiver.set(always(200));
    let request = pb::RedriveRequest {
        consumer_group: "sink.tms".into(),
        batch_ids: vec![id.clone()],
    };
    let redriven = client.redrive(request).await.unwrap().into_inner().redriven;
    assert_eq!(redriven, 1);
    let log = receiver.wait_accepted(&id).await;
    assert_eq!(log.iter().filter(|r| r.id == id).count(), 2);
    wait_acked(&redis, "tms").await;
    service.stop().await;
}

/// Many keys, a receiver that delays and fails at random (seeded): each
/// key's batches are accepted in flush order, no two of a key ever overlap,
/// and every batch is accepted.
#[tokio::test]
async fn order_per_key_under_concurrency() {
    use rand::{Rng, SeedableRng};
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|id: &str, n| {
        // The same answers for the same id and attempt, run after run.
        let seed = id
            .bytes()
            .fold(n as u64, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let status = if rng.random_bool(0.3) { 500 } else { 200 };
        let delay = Duration::from_millis(rng.random_range(0..15));
        (status, vec![], String::new(), delay)
    }))
    .await;
    let sinks = sink_toml(dir.path(), "tms", &receiver.url(), "max_in_flight = 8");
    let service = start(&redis, &sinks, &["tms"]).await;
    let mut flushed: HashMap<String, Vec<String>> = HashMap::new();
    let mut client = service.client().await;
    for round in 0..8 {
        for k in 0..24 {
            let key = format!("area-{k}");
            let id = flush(&mut client, &key, &format!("{key}-{round}")).await;
            flushed.entry(key).or_default().push(id);
        }
    }
    let total: usize = flushed.values().map(Vec::len).sum();
    let log = eventually("every batch to be accepted", || {
        let log = receiver.log();
        let accepted = log.iter().filter(|r| r.status < 300).count();
        async move { (accepted >= total).then_some(log) }
    })
    .await;
    assert!(
        !receiver.seen.lock().unwrap().overlap,
        "two batches of one key overlapped"
    );
    assert!(
        log.iter().any(|r| r.status == 500),
        "the receiver failed some"
    );
    for (key, ids) in &flushed {
        let accepted: Vec<&str> = log
            .iter()
            .filter(|r| &r.key == key && r.status < 300)
            .map(|r| r.id.as_str())
            .collect();
        assert_eq!(accepted, *ids, "key {key}");
    }
    wait_acked(&redis, "tms").await;
    service.stop().await;
}

/// Two instances; the one delivering is SIGKILLed mid-delivery: the other
/// takes its shards over and every batch is accepted (a batch seen twice
/// has one webhook-id); the secret is in no log.
#[tokio::test]
async fn killed_instance_loses_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, _| {
        (200, vec![], String::new(), Duration::from_millis(300))
    }))
    .await;
    let text = support::config_text(
        &redis.url(),
        &format!(
            "{ONE_PER_BATCH}{}",
            sink_toml(dir.path(), "tms", &receiver.url(), "")
        ),
    );
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let mut a = support::process_with(&a_dir, &text).await;
    let store = support::store(&support::config(&redis.url(), ""));
    wait_group(&store, "tms").await;
    let b = support::process_with(&b_dir, &text).await;
    let mut client = support::client(b.addr).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(flush(&mut client, &format!("area-{}", i % 4), &format!("p{i}")).await);
    }
    eventually("an instance to be delivering", || {
        let n = receiver.log().len();
        async move { (n >= 2).then_some(()) }
    })
    .await;
    a.kill();
    let before = receiver.log().len();
    assert!(before < ids.len(), "the kill came mid-delivery");
    let log = eventually("every batch to be accepted", || {
        let log = receiver.log();
        let all = ids
            .iter()
            .all(|id| log.iter().any(|r| &r.id == id && r.status < 300));
        async move { all.then_some(log) }
    })
    .await;
    assert!(
        log.iter().all(|r| ids.contains(&r.id)),
        "only our batches, by their ids"
    );
    for (key, want) in (0..4).map(|k| (format!("area-{k}"), &ids)) {
        let mut firsts: Vec<&str> = Vec::new();
        for r in log.iter().filter(|r| r.key == key) {
            if !firsts.contains(&r.id.as_str()) {
                firsts.push(&r.id);
            }
        }
        let flushed: Vec<&str> = want
            .iter()
            .enumerate()
            .filter(|(i, _)| format!("area-{}", i % 4) == key)
            .map(|(_, id)| id.as_str())
            .collect();
        assert_eq!(
            firsts, flushed,
            "key {key}: first deliveries in flush order"
        );
    }
    wait_acked(&redis, "tms").await;
    let secret_text = whsec(SECRET);
    for log in [a.log(), b.log()] {
        assert!(!log.contains(&secret_text), "{log}");
        assert!(!log.contains("test-secret"), "{log}");
    }
    b.stop().await;
}

/// SIGHUP adds a sink to a running service, which then delivers to it and
/// counts its deliveries by outcome; a new secret is signed with after the
/// next SIGHUP; a removed sink stops and its group stays.
#[tokio::test]
async fn sighup_adds_a_sink() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Arc::new(|_, n| {
        let status = if n == 1 { 503 } else { 200 };
        (status, vec![], String::new(), Duration::ZERO)
    }))
    .await;
    let base = format!("{ONE_PER_BATCH}[http]\nlisten = \"127.0.0.1:0\"\n");
    let mut process =
        support::process_with(dir.path(), &support::config_text(&redis.url(), &base)).await;
    let http = process.http_addr().await;
    let with_sink = format!(
        "{base}{}",
        sink_toml(dir.path(), "tms", &receiver.url(), "")
    );
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, support::config_text(&redis.url(), &with_sink)).unwrap();
    process.signal(libc::SIGHUP);
    let store = support::store(&support::config(&redis.url(), ""));
    wait_group(&store, "tms").await;
    let mut client = support::client(process.addr).await;
    let id = flush(&mut client, "north", "p1").await;
    receiver.wait_accepted(&id).await;
    receiver.set(always(400));
    let refused = flush(&mut client, "south", "p2").await;
    eventually("the refused batch to be dead-lettered", || {
        let store = store.clone();
        let refused = refused.clone();
        async move {
            store
                .sink_failure("sink.tms", &refused)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    let scrape = support::scrape::scrape(http).await;
    let outcome = |o| {
        scrape.get(
            "batcher_sink_deliveries_total",
            &[("outcome", o), ("sink", "tms")],
        )
    };
    assert_eq!(outcome("delivered"), 1.0);
    assert_eq!(outcome("failed"), 1.0);
    assert_eq!(outcome("dead_lettered"), 1.0);
    assert_eq!(
        scrape.get("batcher_sink_retrying_keys", &[("sink", "tms")]),
        0.0
    );

    // A rotated secret file is read again on SIGHUP.
    receiver.set(always(200));
    std::fs::write(dir.path().join("tms.secret"), whsec(OLD_SECRET)).unwrap();
    process.signal(libc::SIGHUP);
    eventually("the sink to restart with the new secret", || {
        let restarted = process.log().matches("sink started").count() >= 2;
        async move { restarted.then_some(()) }
    })
    .await;
    let id = flush(&mut client, "north", "p3").await;
    let log = receiver.wait_accepted(&id).await;
    let r = log.iter().find(|r| r.id == id).unwrap();
    assert_eq!(r.signature, signature(OLD_SECRET, r));

    // Removed, its group stays; back again, it resumes where its group
    // stood: the batch flushed while it was gone is delivered.
    std::fs::write(&path, support::config_text(&redis.url(), &base)).unwrap();
    process.signal(libc::SIGHUP);
    eventually("the sink to be removed", || {
        let removed = process.log().contains("sink removed");
        async move { removed.then_some(()) }
    })
    .await;
    let kept = flush(&mut client, "north", "p4").await;
    assert!(store.consumer_group("sink.tms").await.unwrap().is_some());
    std::fs::write(&path, support::config_text(&redis.url(), &with_sink)).unwrap();
    process.signal(libc::SIGHUP);
    receiver.wait_accepted(&kept).await;
    process.stop().await;
}
