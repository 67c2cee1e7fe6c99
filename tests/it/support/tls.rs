//! TLS for tests: a throw-away CA and a server certificate for 127.0.0.1,
//! made with rcgen into a test's own dir, client certificates the CA signs,
//! and a real redis-server that speaks only TLS.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use batcher::embedded::launcher::{self, Launch, Listen};
use batcher_testkit::cluster::ClusterTls;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::eventually;

/// The PEM files of a test CA and of a server certificate it signed.
pub struct Certs {
    /// The CA's certificate: what clients trust.
    pub ca_file: PathBuf,
    /// The server's certificate, valid for 127.0.0.1 and localhost.
    pub cert_file: PathBuf,
    /// The server's private key.
    pub key_file: PathBuf,
    /// What signs client certificates: the CA's parameters and key (PEM).
    ca: (CertificateParams, String),
}

impl Certs {
    /// Makes a CA and a server certificate, and writes them into `dir`.
    pub fn generate(dir: &Path) -> Certs {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "batcher test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let ca_kept = (ca.clone(), ca_key.serialize_pem());
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "batcher test redis");
        let cert = server.signed_by(&key, &issuer).unwrap();

        let certs = Certs {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("redis.pem"),
            key_file: dir.join("redis.key"),
            ca: ca_kept,
        };
        std::fs::write(&certs.ca_file, ca_cert.pem()).unwrap();
        std::fs::write(&certs.cert_file, cert.pem()).unwrap();
        std::fs::write(&certs.key_file, key.serialize_pem()).unwrap();
        certs
    }

    /// A client certificate signed by this CA, as PEM (certificate, key).
    pub fn client_pem(&self, name: &str) -> (String, String) {
        let issuer = Issuer::new(self.ca.0.clone(), KeyPair::from_pem(&self.ca.1).unwrap());
        let key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.distinguished_name.push(DnType::CommonName, name);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = client.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// The same files, as a TLS cluster of the launcher takes them.
    pub fn cluster(&self) -> ClusterTls {
        ClusterTls {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            ca_file: self.ca_file.clone(),
        }
    }

    /// A redis-rs client of `url` that trusts this CA only.
    pub fn client(&self, url: &str) -> redis::Client {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&self.ca_file).unwrap()),
        };
        redis::Client::build_with_tls(url, certs).unwrap()
    }
}

/// How many free ports [`tls_only_server`] tries: redis-server binds its
/// TLS port itself, after the probe has released it, so another bind can
/// take it first.
const PORT_ATTEMPTS: usize = 5;

/// A redis-server in `dir` that listens only on a TLS port (`--port 0`),
/// with `certs`, killed on drop; and its `rediss://127.0.0.1:PORT` URL.
/// Returns once it answers PING over TLS; a server that exits first (its
/// port was taken) is started again on another port.
pub async fn tls_only_server(certs: &Certs, dir: &Path) -> (launcher::RedisServer, String) {
    let mut log = PathBuf::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = launcher::free_port().unwrap();
        let server = Launch::new()
            .dir(dir)
            .listen(Listen::Port(port))
            .config("port", "0")
            .tls(port, &certs.cert_file, &certs.key_file, &certs.ca_file)
            .config("appendonly", "no")
            .spawn()
            .unwrap();
        let url = format!("rediss://127.0.0.1:{port}");
        if answers_tls(certs, &url, &server).await {
            return (server, url);
        }
        log = server.log_path().to_owned();
    }
    let tail = launcher::log_tail(&log, launcher::LOG_TAIL_LINES);
    panic!("no TLS redis-server came up on {PORT_ATTEMPTS} free ports; its log:\n{tail}")
}

/// Waits until `server` answers PING over TLS at `url` (true), or exits
/// (false).
async fn answers_tls(certs: &Certs, url: &str, server: &launcher::RedisServer) -> bool {
    let client = certs.client(url);
    eventually("the TLS redis-server to answer PING or exit", || {
        let client = client.clone();
        let running = server.is_running();
        async move {
            if !running {
                return Some(false);
            }
            let mut con = client.get_multiplexed_async_connection().await.ok()?;
            let pong = redis::cmd("PING").query_async::<String>(&mut con).await;
            pong.ok().map(|_| true)
        }
    })
    .await
}
