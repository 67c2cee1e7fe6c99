//! TLS on the gRPC port, with certificates made by the test (rcgen) and a
//! real TLS client: the API and health over TLS, a plaintext client or one
//! that trusts another CA refused, mutual TLS, bad files stopping the start
//! with an error naming them, and certificates rotated on SIGHUP.

use crate::support;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;

use crate::support::tls::Certs;
use crate::support::{Process, RedisServer, Service, add, eventually};
use batcher::config::Config;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// The `[tls]` table for `certs`, with `client_ca` when given.
fn tls_toml(certs: &Certs, client_ca: Option<&Path>) -> String {
    let mut text = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        certs.cert_file.display(),
        certs.key_file.display()
    );
    if let Some(ca) = client_ca {
        text.push_str(&format!("client_ca = \"{}\"\n", ca.display()));
    }
    text
}

/// Config text for a service over `redis` with `tls` (a `[tls]` table).
fn config_text(redis: &RedisServer, tls: &str) -> String {
    support::config_text(
        &redis.url(),
        &format!("[http]\nlisten = \"127.0.0.1:0\"\n{tls}"),
    )
}

fn config(redis: &RedisServer, tls: &str) -> Config {
    Config::parse(&config_text(redis, tls), "t.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// A TLS channel to `addr` that trusts the CA in `ca` only, presenting
/// `identity` (certificate and key PEM) if given. Fails when the handshake does.
async fn tls_channel(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Channel::from_shared(format!("https://{addr}")).unwrap();
    endpoint.tls_config(tls)?.connect().await
}

/// Why a client trusting `ca` (with `identity`) is not served: the error
/// of its handshake or of its first call, with every cause; None when served.
async fn refusal(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<&(String, String)>,
) -> Option<String> {
    let channel = match tls_channel(addr, ca, identity).await {
        Ok(channel) => channel,
        Err(e) => return Some(causes(&e)),
    };
    let mut client = BatcherClient::new(channel);
    let request = pb::GetGroupRequest { key: "k".into() };
    let status = client.get_group(request).await.err()?;
    Some(format!("{status:?}: {}", causes(&status)))
}

/// `error` and its sources, joined.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// `batcher serve` with `text` as its config, logging its failed TLS
/// handshakes with their cause: a refusal by the server is proved by its
/// log, since the client may see the connection reset before the alert.
pub async fn serve_logging_handshakes(dir: &Path, text: &str) -> Process {
    let path = dir.join("batcher.toml");
    std::fs::write(&path, text).unwrap();
    support::serve(&path, dir)
        .env("RUST_LOG", "info,batcher::tls=debug")
        .bound()
        .await
}

/// Asserts that `refuse` (a client's refused attempt) makes `process` log a
/// failed TLS handshake whose error says `cause`.
pub async fn assert_refused_for<F: Future<Output = ()>>(process: &Process, cause: &str, refuse: F) {
    let before = process.log().len();
    refuse.await;
    eventually(&format!("a TLS handshake refused for {cause:?}"), || {
        let log = process.log();
        let found = log[before..]
            .lines()
            .any(|line| line.contains("TLS handshake failed") && line.contains(cause));
        async move { found.then_some(()) }
    })
    .await;
}

/// Whether a client trusting `ca` (with `identity`) gets a call served.
async fn served(addr: SocketAddr, ca: &Path, identity: Option<&(String, String)>) -> bool {
    refusal(addr, ca, identity).await.is_none()
}

/// What rustls says of a certificate that another test CA signed: every
/// test CA bears one name, so the issuer is found by name and its signature
/// does not verify.
pub const OTHER_CA: &str = "invalid peer certificate: BadSignature";

/// Asserts that a client trusting `ca`, which did not sign the server's
/// certificate, refuses the server: its own handshake fails on the
/// signature ([`OTHER_CA`]), not on anything else (a closed port, a call
/// that failed otherwise).
async fn assert_tls_refusal(addr: SocketAddr, ca: &Path) {
    let why = refusal(addr, ca, None)
        .await
        .expect("served, but the client should not trust the server");
    assert!(
        why.contains(OTHER_CA),
        "refused, but not for the server's certificate: {why}"
    );
}

/// Over TLS the API and health work; a plaintext client and a client that
/// trusts another CA are refused, and write nothing.
#[tokio::test]
async fn tls_serves_and_refuses_plaintext() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let service = Service::start(config(&redis, &tls_toml(&certs, None))).await;
    let channel = eventually("a TLS connection", || async {
        tls_channel(service.addr, &certs.ca_file, None).await.ok()
    })
    .await;
    let mut client = BatcherClient::new(channel.clone());
    let added = client.add(add("k", "1", b"x")).await.unwrap().into_inner();
    assert_eq!(added.group_size, 1);
    let keys = redis.data_keys();

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest::default();
    health.check(request).await.expect("health over TLS");

    let plain = Channel::from_shared(format!("http://{}", service.addr)).unwrap();
    let mut plain = BatcherClient::new(plain.connect_lazy());
    let status = plain.add(add("plain", "2", b"y")).await.unwrap_err();
    // The server hangs up on a client that does not speak TLS; the client
    // sees it as a transport error (UNAVAILABLE or UNKNOWN, by timing, or
    // INTERNAL when its HTTP/2 layer reads the TLS alert as a bad frame),
    // with no status from the service, which meanwhile serves TLS clients
    // on: a refusal, not a crash.
    let refused = [tonic::Code::Unavailable, tonic::Code::Unknown];
    let bad_frame =
        status.code() == tonic::Code::Internal && status.message().contains("h2 protocol error");
    assert!(refused.contains(&status.code()) || bad_frame, "{status:?}");
    assert!(
        status.metadata().get("content-type").is_none(),
        "{status:?}"
    );
    assert_eq!(redis.data_keys(), keys, "the refused client wrote");
    let again = client.add(add("k", "3", b"z")).await.unwrap().into_inner();
    assert_eq!(again.group_size, 2, "the TLS client is still served");

    let other = tempfile::tempdir().unwrap();
    let other = Certs::generate(other.path());
    assert_tls_refusal(service.addr, &other.ca_file).await;
    service.stop().await;
}

/// With `client_ca`, a client must present a certificate that CA signed:
/// one with none, or one signed by another CA, is refused, and the server
/// says which.
#[tokio::test]
async fn mutual_tls_requires_a_client_certificate() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let clients_dir = tempfile::tempdir().unwrap();
    let clients = Certs::generate(clients_dir.path());
    let tls = tls_toml(&certs, Some(&clients.ca_file));
    let process = serve_logging_handshakes(dir.path(), &config_text(&redis, &tls)).await;
    let identity = clients.client_pem("depot-berlin");
    eventually("a client with a certificate to be served", || async {
        served(process.addr, &certs.ca_file, Some(&identity))
            .await
            .then_some(())
    })
    .await;
    let (addr, ca) = (process.addr, &certs.ca_file);
    let refused = |identity| async move {
        let why = refusal(addr, ca, identity).await;
        assert!(why.is_some(), "served without a certificate its CA signed");
    };
    assert_refused_for(&process, "peer sent no certificates", refused(None)).await;
    let stranger = certs.client_pem("stranger");
    assert_refused_for(&process, OTHER_CA, refused(Some(&stranger))).await;
    process.stop().await;
}

/// A missing or bad `[tls]` file stops the start with an error that names
/// the field, the file and what is wrong.
#[tokio::test]
async fn bad_tls_files_stop_the_start() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let other = tempfile::tempdir().unwrap();
    let other = Certs::generate(other.path());
    let missing = dir.path().join("missing.pem");
    let (cert, key, ca) = (&certs.cert_file, &certs.key_file, &certs.ca_file);
    let files = |cert: &Path, key: &Path, ca: &Path| {
        format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
            cert.display(),
            key.display(),
            ca.display()
        )
    };
    let cases = [
        (
            files(&missing, key, ca),
            format!("[tls] cert {}: cannot be read", missing.display()),
        ),
        (
            files(key, key, ca),
            format!("[tls] cert {}: holds no PEM certificate", key.display()),
        ),
        (
            files(cert, &missing, ca),
            format!("[tls] key {}: cannot be read", missing.display()),
        ),
        (
            files(cert, cert, ca),
            format!("[tls] key {}: holds no PEM private key", cert.display()),
        ),
        (
            files(cert, key, key),
            format!(
                "[tls] client_ca {}: holds no PEM certificate",
                key.display()
            ),
        ),
        (
            files(cert, &other.key_file, ca),
            format!("[tls] cert {}: does not go with key", cert.display()),
        ),
    ];
    for (tls, want) in cases {
        let msg = support::start_error(config(&redis, &tls)).await;
        assert!(msg.contains(&want), "want {want:?} in {msg:?}");
    }
}

/// SIGHUP rotates the certificate without a restart: after new files are
/// written, a client that trusts only the new CA connects. A bad file on a
/// later SIGHUP is logged and the certificates in force stay.
#[tokio::test]
async fn sighup_rotates_the_certificate() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, config_text(&redis, &tls_toml(&certs, None))).unwrap();
    let process = support::serve(&path, dir.path()).bound().await;
    eventually("the TLS port to serve", || async {
        served(process.addr, &certs.ca_file, None)
            .await
            .then_some(())
    })
    .await;

    let next_dir = tempfile::tempdir().unwrap();
    let next = Certs::generate(next_dir.path());
    assert_tls_refusal(process.addr, &next.ca_file).await;
    std::fs::copy(&next.cert_file, &certs.cert_file).unwrap();
    std::fs::copy(&next.key_file, &certs.key_file).unwrap();
    process.signal(libc::SIGHUP);
    eventually("a client trusting only the new CA to be served", || async {
        served(process.addr, &next.ca_file, None)
            .await
            .then_some(())
    })
    .await;
    assert_tls_refusal(process.addr, &certs.ca_file).await;

    std::fs::write(&certs.cert_file, "not a certificate").unwrap();
    process.signal(libc::SIGHUP);
    eventually("the failed reload in the log", || async {
        process.log().contains("TLS reload failed").then_some(())
    })
    .await;
    assert!(served(process.addr, &next.ca_file, None).await);
}
