//! Credentials and TLS to Redis, on real redis-servers: a password or an ACL
//! user in `url` and in every `cluster_nodes` entry, or from
//! `password_file`, `rediss://` with
//! `tls_ca_file` on a TLS-only Redis and on a TLS cluster, and the errors a
//! wrong password or a wrong CA give.

use crate::support;

use std::path::Path;

use crate::support::tls::{Certs, tls_only_server};
use crate::support::{Service, add, eventually, next_batch};
use batcher::config::Config;
use batcher::embedded::launcher::Launch;
use batcher::pb;
use batcher_testkit::cluster::{Cluster, ClusterOptions};
use tonic::Code;

/// The password of the test servers' `default` user.
const PASSWORD: &str = "s3cret-pass";

/// Flush policy of the exercise: a group flushes at its second item.
const DEFAULTS: &str = "[defaults]\nmax_items = 2\nmax_wait = \"1h\"\n";

/// A config over one Redis at `url`, with `redis` lines added to `[redis]`.
fn single(url: &str, redis: &str) -> Config {
    let text = format!("{DEFAULTS}\n[redis]\nurl = \"{url}\"\nshards = 4\n{redis}\n");
    Config::parse(&text, "test.toml").unwrap_or_else(|e| panic!("test config: {e}"))
}

/// A config over the cluster seeds `urls`, with `redis` lines added.
fn over_cluster(urls: &[String], redis: &str) -> Config {
    support::cluster::config(urls, "auth", DEFAULTS, redis)
}

/// Runs the service on `config` and checks that it works end to end: a live
/// subscription gets the batch that an add completes and the one a manual
/// flush cuts.
async fn exercise(config: Config) {
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let request = pb::SubscribeRequest::default();
    let mut batches = client.subscribe(request).await.unwrap().into_inner();
    client.add(add("size", "1", b"a")).await.unwrap();
    let reply = client.add(add("size", "2", b"b")).await.unwrap();
    let flushed = reply.into_inner().flushed.expect("the second add flushes");
    assert_eq!(flushed.items.len(), 2);
    client.add(add("manual", "x", b"c")).await.unwrap();
    let flush = pb::FlushRequest {
        key: "manual".into(),
    };
    let cut = client.flush(flush).await.unwrap().into_inner();
    assert_eq!(cut.batch.expect("a batch").items.len(), 1);
    let mut keys: Vec<String> = Vec::new();
    for _ in 0..2 {
        keys.push(next_batch(&mut batches).await.key);
    }
    keys.sort();
    assert_eq!(keys, ["manual", "size"]);
    service.stop().await;
}

/// Runs the service on `config`, whose credentials Redis refuses, and
/// returns the status that an add fails with.
async fn refused_add(config: Config) -> tonic::Status {
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let status = client.add(add("k", "1", b"")).await.unwrap_err();
    service.stop().await;
    status
}

/// A wrong password is not transient: the call fails INTERNAL and says
/// that authentication failed.
fn assert_auth_failed(status: &tonic::Status) {
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let msg = status.message().to_lowercase();
    assert!(msg.contains("authentication failed"), "{status:?}");
    assert!(
        !msg.contains("wrong-pass"),
        "{status:?} echoes the password"
    );
}

/// The password and an ACL user both work in `url`; a wrong password or
/// user fails every call INTERNAL with "authentication failed", none fails
/// them INTERNAL too, and either way the service starts and its start-up
/// warning says that authentication failed.
#[tokio::test]
async fn password_and_acl_user_in_url() {
    let acl_user = ["--user", "batcher", "on", ">user-pass", "~*", "&*", "+@all"];
    let launch = Launch::new().password(PASSWORD).config("appendonly", "no");
    let redis = acl_user
        .iter()
        .fold(launch, |l, arg| l.arg(arg))
        .start()
        .unwrap();
    let port = redis.port().unwrap();
    exercise(single(&format!("redis://:{PASSWORD}@127.0.0.1:{port}"), "")).await;
    // Its own prefix: the first run's items are still within the dedup window.
    let acl = single(
        &format!("redis://batcher:user-pass@127.0.0.1:{port}"),
        "prefix = \"acl\"",
    );
    exercise(acl).await;
    for url in [
        format!("redis://:wrong-pass@127.0.0.1:{port}"),
        format!("redis://nobody:wrong-pass@127.0.0.1:{port}"),
    ] {
        assert_auth_failed(&refused_add(single(&url, "")).await);
    }
    // With no password, Redis's answer depends on the command (NOAUTH, or a
    // protocol error for a long one): the start-up warning says it plainly.
    let none = refused_add(single(&format!("redis://127.0.0.1:{port}"), "")).await;
    assert_eq!(none.code(), Code::Internal, "{none:?}");
    for url in [
        format!("redis://:wrong-pass@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        warns_auth_failed(&format!("[redis]\nurl = \"{url}\"\n")).await;
    }
}

/// `[redis] password_file` gives the password to a URL that carries none
/// (its trailing newline is not part of it); a missing file stops the start,
/// naming it.
#[tokio::test]
async fn password_file_for_a_url_without_one() {
    let launch = Launch::new().password(PASSWORD).config("appendonly", "no");
    let redis = launch.start().unwrap();
    let url = format!("redis://127.0.0.1:{}", redis.port().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = password_file(dir.path());
    exercise(single(&url, &file)).await;
    let missing = dir.path().join("missing.pass");
    let line = format!("password_file = \"{}\"", missing.display());
    let msg = support::start_error(single(&url, &line)).await;
    let want = format!(
        "[redis] password_file {}: cannot be read",
        missing.display()
    );
    assert!(msg.contains(&want), "{msg}");
}

/// Writes PASSWORD and a newline to a file in `dir`; returns the
/// `password_file` line naming it.
fn password_file(dir: &Path) -> String {
    let file = dir.join("redis.pass");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    format!("password_file = \"{}\"", file.display())
}

/// The service binary, run with config `text` whose credentials Redis
/// refuses, starts and says so in its start-up warning, with no password.
async fn warns_auth_failed(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, text).unwrap();
    let process = support::serve(&path, dir.path()).start().await;
    eventually("the start-up warning", || async {
        process
            .log()
            .contains("redis authentication failed")
            .then_some(())
    })
    .await;
    assert!(!process.log().contains("wrong-pass"), "{}", process.log());
}

/// `rediss://` with `tls_ca_file` works on a Redis that serves only TLS;
/// without the CA the server is not trusted (calls fail UNAVAILABLE), and a
/// CA file that is missing or holds no certificate stops the start, naming
/// the field and the file.
#[tokio::test]
async fn rediss_url_with_tls_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let (_redis, url) = tls_only_server(&certs, dir.path()).await;
    let ca = format!("tls_ca_file = \"{}\"", certs.ca_file.display());
    exercise(single(&url, &ca)).await;

    let untrusted = refused_add(single(&url, "")).await;
    assert_eq!(untrusted.code(), Code::Unavailable, "{untrusted:?}");

    let missing = dir.path().join("missing.pem");
    let msg = support::start_error(single(
        &url,
        &format!("tls_ca_file = \"{}\"", missing.display()),
    ))
    .await;
    let want = format!("[redis] tls_ca_file {}: cannot be read", missing.display());
    assert!(msg.contains(&want), "{msg}");
    let not_pem = &certs.key_file;
    let msg = support::start_error(single(
        &url,
        &format!("tls_ca_file = \"{}\"", not_pem.display()),
    ))
    .await;
    let want = format!(
        "[redis] tls_ca_file {}: holds no PEM certificate",
        not_pem.display()
    );
    assert!(msg.contains(&want), "{msg}");
}

/// A 3-master cluster (no replicas), with `password` and `tls` if given.
/// Nodes die with the calling thread: call it from the test's own.
fn start_cluster(dir: &Path, tls: bool) -> (Cluster, Option<Certs>) {
    let certs = tls.then(|| Certs::generate(dir));
    let options = ClusterOptions {
        masters: 3,
        replicas_per_master: 0,
        password: Some(PASSWORD.to_owned()),
        tls: certs.as_ref().map(Certs::cluster),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&options).unwrap_or_else(|e| panic!("starting a cluster: {e}"));
    (cluster, certs)
}

/// The service works on a password-protected cluster through
/// `cluster_nodes` with the password in every URL. With a wrong one, calls
/// fail UNAVAILABLE (the cluster client reaches no node; it does not say
/// why), and the start-up warning says that authentication failed.
#[tokio::test]
async fn password_in_cluster_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, _) = start_cluster(dir.path(), false);
    let urls = cluster.urls();
    assert!(urls.iter().all(|u| u.contains(PASSWORD)), "{urls:?}");
    exercise(over_cluster(&urls, "")).await;
    // The same nodes without the password in their URLs, and password_file;
    // its own prefix, as the first run's items are within the dedup window.
    let bare: Vec<String> = urls
        .iter()
        .map(|u| u.replace(&format!(":{PASSWORD}@"), ""))
        .collect();
    assert!(bare.iter().all(|u| !u.contains(PASSWORD)), "{bare:?}");
    let file = password_file(dir.path());
    exercise(support::cluster::config(&bare, "file", DEFAULTS, &file)).await;
    let wrong: Vec<String> = urls
        .iter()
        .map(|u| u.replace(PASSWORD, "wrong-pass"))
        .collect();
    let status = refused_add(over_cluster(&wrong, "")).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let nodes: Vec<String> = wrong.iter().map(|u| format!("\"{u}\"")).collect();
    warns_auth_failed(&format!(
        "[redis]\ncluster_nodes = [{}]\n",
        nodes.join(", ")
    ))
    .await;
}

/// The service works on a password-protected TLS cluster through
/// `rediss://` seeds and `tls_ca_file`: every node it discovers is reached
/// over TLS too: the nodes' plaintext ports are closed before it starts.
#[tokio::test]
async fn rediss_cluster_nodes_with_tls_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, certs) = start_cluster(dir.path(), true);
    let urls = cluster.tls_urls();
    assert_eq!(urls.len(), 3);
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    for node in cluster.nodes() {
        let auth = ["-a", PASSWORD, "--no-auth-warning"];
        let closed = support::redis::cli(
            node.port(),
            &[&auth[..], &["CONFIG", "SET", "port", "0"]].concat(),
        );
        assert_eq!(
            closed,
            "OK",
            "closing the plaintext port of {}",
            node.port()
        );
    }
    let ca = certs.unwrap().ca_file;
    exercise(over_cluster(
        &urls,
        &format!("tls_ca_file = \"{}\"", ca.display()),
    ))
    .await;
}
