//! The operator CLI's one-shot commands, run as the built binary against a
//! real service and a real Redis: add, get, list (tables, JSON lines,
//! paging), flush, remove, requeue, dead-letters and redrive; errors with
//! their gRPC code and exit status; `config check` with `serve`'s errors; a
//! bearer token (flag and environment); TLS and mutual TLS.

use crate::support;

use std::collections::BTreeSet;

use crate::support::cli::{at, failed, json_lines, ok, run};
use crate::support::tls::Certs;
use crate::support::{RedisServer, Service, config};
use crate::tls::{OTHER_CA, assert_refused_for, serve_logging_handshakes};
use sha2::{Digest, Sha256};

/// Three parcels added with the CLI show in `get` and `list`, as tables and
/// as JSON lines (the protobuf JSON mapping), and `list` pages on request.
#[tokio::test]
async fn add_get_and_list() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let addr = service.addr;
    let added = ok(&at(
        addr,
        &["add", "north-1", "parcel-1", "--payload", "to Berlin"],
    )
    .await);
    assert_eq!(added.trim(), "added parcel-1 to north-1 (group size 1)");
    let measured = ["add", "north-1", "parcel-2", "--measure", "weight_g=1200"];
    ok(&at(addr, &measured).await);
    ok(&at(addr, &["add", "north-2", "parcel-3"]).await);
    let again = ok(&at(addr, &["add", "north-1", "parcel-1"]).await);
    assert!(again.starts_with("duplicate: parcel-1"), "{again}");

    let table = ok(&at(addr, &["get", "north-1"]).await);
    assert!(table.contains("items:     2/"), "{table}");
    assert!(table.contains("weight_g=1200"), "{table}");
    let rows = table.lines().skip_while(|l| !l.starts_with("ID "));
    let rows = rows
        .map(|l| l.split_whitespace().next().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(rows, ["ID", "parcel-1", "parcel-2"], "{table}");
    assert!(
        table.contains("to Berlin"),
        "the payload shows as text: {table}"
    );

    let group = &json_lines(&ok(&at(addr, &["get", "north-1", "--json"]).await))[0];
    assert_eq!(group["key"], "north-1");
    assert_eq!(group["size"], 2);
    assert_eq!(group["items"][0]["id"], "parcel-1");
    assert_eq!(
        group["items"][0]["payload"], "dG8gQmVybGlu",
        "bytes as base64"
    );
    assert_eq!(group["items"][1]["measures"]["weight_g"], "1200");

    let table = ok(&at(addr, &["list"]).await);
    let lines = table.lines().collect::<Vec<_>>();
    assert!(lines[0].starts_with("KEY "), "{table}");
    let keys = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap());
    assert_eq!(
        keys.collect::<BTreeSet<_>>(),
        BTreeSet::from(["north-1", "north-2"])
    );
    let column = lines[0].find("ITEMS").unwrap();
    assert!(
        lines.iter().all(|l| l.get(column..column + 1) != Some(" ")),
        "{table}"
    );

    let groups = json_lines(&ok(
        &at(addr, &["list", "--json", "--prefix", "north-"]).await
    ));
    let keys = groups.iter().map(|g| g["key"].as_str().unwrap().to_owned());
    assert_eq!(keys.collect::<BTreeSet<_>>().len(), 2, "{groups:?}");
    assert!(
        groups.iter().all(|g| g.get("items").is_none()),
        "{groups:?}"
    );

    let first = at(addr, &["list", "--json", "--page-size", "1"]).await;
    assert_eq!(json_lines(&ok(&first)).len(), 1);
    let hint = String::from_utf8_lossy(&first.stderr);
    assert!(hint.contains("--page-token"), "{hint}");
    let all = ok(&at(addr, &["list", "--json", "--page-size", "1", "--all"]).await);
    assert_eq!(json_lines(&all).len(), 2, "{all}");
    service.stop().await;
}

/// `flush` and `remove` print what they did, as text and as JSON; a flush
/// of a key with no open group flushes nothing, and `get` of it exits 1.
#[tokio::test]
async fn flush_and_remove() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let addr = service.addr;
    for id in ["a", "b", "c"] {
        ok(&at(addr, &["add", "k", id]).await);
    }
    let removed = ok(&at(addr, &["remove", "k", "b"]).await);
    assert_eq!(removed.trim(), "removed b from k (group size 2)");
    let removed = json_lines(&ok(&at(addr, &["remove", "k", "b", "--json"]).await));
    assert_eq!(removed[0]["groupSize"], 2);
    assert!(removed[0].get("removed").is_none(), "false is left out");

    let flushed = json_lines(&ok(&at(addr, &["flush", "k", "--json"]).await));
    let batch = &flushed[0]["batch"];
    assert_eq!(batch["reason"], "FLUSH_REASON_MANUAL");
    let ids = batch["items"].as_array().unwrap().iter().map(|i| &i["id"]);
    assert_eq!(ids.collect::<Vec<_>>(), ["a", "c"]);
    let nothing = ok(&at(addr, &["flush", "k"]).await);
    assert!(nothing.contains("nothing flushed"), "{nothing}");
    let missing = failed(&at(addr, &["get", "k"]).await, 1);
    assert_eq!(missing.trim(), "batcher: no open group under key \"k\"");

    ok(&at(addr, &["add", "k", "d", "--close"]).await);
    let text = ok(&at(addr, &["add", "k", "e", "--close"]).await);
    assert!(text.contains("reason CLOSED"), "{text}");
    service.stop().await;
}

/// A rejected request exits 1 and prints the gRPC code, the message naming
/// the field and the error details; an unreachable service is UNAVAILABLE;
/// a usage error exits 2.
#[tokio::test]
async fn errors_print_the_code_and_exit_non_zero() {
    let redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let stderr = failed(&at(service.addr, &["add", "k", ""]).await, 1);
    assert!(
        stderr.starts_with("batcher: INVALID_ARGUMENT: item.id: must not be empty"),
        "{stderr}"
    );
    assert!(
        stderr.contains("reason: INVALID_FIELD (batcher) fields=item.id"),
        "{stderr}"
    );

    let stderr = failed(&at(service.addr, &["requeue", "not-a-batch", "x"]).await, 1);
    assert!(
        stderr.starts_with("batcher: INVALID_ARGUMENT: batch_id:"),
        "{stderr}"
    );
    let stderr = failed(&at(service.addr, &["list", "--page-size=-1"]).await, 2);
    assert!(stderr.contains("--page-size"), "{stderr}");

    // A port held bound but not listening: a connection to it is refused.
    let held = support::HeldPort::new();
    let gone = held.addr;
    let stderr = failed(&at(gone, &["list", "--timeout", "10s"]).await, 1);
    assert!(
        stderr.starts_with("batcher: UNAVAILABLE: cannot connect to"),
        "{stderr}"
    );
    failed(&run(&["add", "only-a-key"]).await, 2);
    service.stop().await;
}

/// `config check` prints ok for a good file, and for a bad one exits 1
/// with exactly the error `serve` gives for it.
#[tokio::test]
async fn config_check_matches_serve() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[defaults]\nmax_items = 10\nmax_wait = \"2s\"\n").unwrap();
    let good = good.to_str().unwrap();
    let out = ok(&run(&["config", "check", good]).await);
    assert_eq!(out.trim(), format!("{good}: ok"));

    for text in [
        "[defaults]\nmax_items = 0\n",
        "[defaults]\nmax_itmes = 3\n",
        "x = ",
    ] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, text).unwrap();
        let bad = bad.to_str().unwrap();
        let check = failed(&run(&["config", "check", bad]).await, 1);
        let serve = failed(&run(&["serve", "--config", bad]).await, 1);
        assert_eq!(check, serve, "{text}");
        assert!(check.starts_with(&format!("batcher: {bad}")), "{check}");
    }
    let missing = failed(&run(&["config", "check", "/no/such/file.toml"]).await, 1);
    let serve = failed(&run(&["serve", "--config", "/no/such/file.toml"]).await, 1);
    assert_eq!(missing, serve);
}

/// Against a service with auth, `--token` and `BATCHER_TOKEN` are sent as
/// bearer tokens; without one the call is UNAUTHENTICATED.
#[tokio::test]
async fn token_from_flag_or_environment() {
    let redis = RedisServer::start();
    let digest = format!("{:x}", Sha256::digest(b"s3cret"));
    let auth =
        format!("[[auth.tokens]]\nname = \"ops\"\nsha256 = \"{digest}\"\nroles = [\"admin\"]\n");
    let service = Service::start(config(&redis.url(), &auth)).await;
    let addr = service.addr;
    let stderr = failed(&at(addr, &["add", "k", "1"]).await, 1);
    assert!(stderr.starts_with("batcher: UNAUTHENTICATED:"), "{stderr}");
    let stderr = failed(&at(addr, &["add", "k", "1", "--token", "wrong"]).await, 1);
    assert!(stderr.starts_with("batcher: UNAUTHENTICATED:"), "{stderr}");
    ok(&at(addr, &["add", "k", "1", "--token", "s3cret"]).await);

    let addr = addr.to_string();
    let env = [("BATCHER_ADDR", addr.as_str()), ("BATCHER_TOKEN", "s3cret")];
    let list = support::cli::run_with(&["list", "--json"], &env).await;
    assert_eq!(json_lines(&ok(&list))[0]["key"], "k");
    service.stop().await;
}

/// With `--tls-ca` the CLI speaks TLS (checking the name `--tls-domain`
/// gives); mutual TLS takes `--tls-cert` and `--tls-key`; a client without
/// a certificate is refused for that and a plaintext one for speaking no
/// TLS (the server's log says so each time), and one that trusts another
/// CA refuses the server's certificate.
#[tokio::test]
async fn tls_and_mutual_tls() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path());
    let (cert, key) = certs.client_pem("operator");
    let (cert_file, key_file) = (dir.path().join("op.pem"), dir.path().join("op.key"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        certs.cert_file.display(),
        certs.key_file.display(),
        certs.ca_file.display()
    );
    let text = support::config_text(&redis.url(), &tls);
    let service = serve_logging_handshakes(dir.path(), &text).await;
    let ca = certs.ca_file.to_str().unwrap();
    let identity = [
        "--tls-cert",
        cert_file.to_str().unwrap(),
        "--tls-key",
        key_file.to_str().unwrap(),
    ];
    let add = ["add", "k", "1", "--tls-ca", ca, "--tls-domain", "localhost"];
    let added = support::eventually("the TLS port to serve", || async {
        let output = at(service.addr, &[&add[..], &identity].concat()).await;
        output.status.success().then_some(output)
    })
    .await;
    assert!(ok(&added).starts_with("added 1 to k"));

    let get = ["get", "k", "--json", "--tls-ca", ca];
    let group = json_lines(&ok(&at(service.addr, &[&get[..], &identity].concat()).await));
    assert_eq!(group[0]["size"], 1);
    // The same call without the certificate is refused: it differs from the
    // served one above only by the identity. The client may see the alert
    // or the connection reset after it; the server's log names the cause.
    let refused = async {
        let stderr = failed(&at(service.addr, &get).await, 1);
        assert!(stderr.starts_with("batcher: "), "{stderr}");
    };
    assert_refused_for(&service, "peer sent no certificates", refused).await;

    // A CLI that trusts another CA refuses the server's certificate.
    let other = tempfile::tempdir().unwrap();
    let other = Certs::generate(other.path());
    let other_ca = other.ca_file.to_str().unwrap();
    let get_other = ["get", "k", "--json", "--tls-ca", other_ca];
    let stderr = failed(
        &at(service.addr, &[&get_other[..], &identity].concat()).await,
        1,
    );
    assert!(stderr.contains(OTHER_CA), "{stderr}");

    // A CLI without --tls-ca speaks plaintext HTTP/2, which is no TLS record.
    let plain = async {
        let get = ["get", "k", "--timeout", "10s"];
        let stderr = failed(&at(service.addr, &get).await, 1);
        assert!(stderr.starts_with("batcher: "), "{stderr}");
    };
    assert_refused_for(&service, "InvalidContentType", plain).await;
    service.stop().await;
}
