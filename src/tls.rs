//! TLS on the gRPC port (rustls, ring): the `[tls]` files read into a
//! server config, mutual TLS when `client_ca` is set, and the incoming
//! connections, accepted here and handed to tonic already decrypted.
//!
//! The server config sits behind an [`ArcSwap`]: a reload on SIGHUP swaps in
//! the new certificates, and every connection accepted after it uses them;
//! connections already open keep theirs. A reload that fails is logged and
//! the certificates in force stay.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::TlsConfig;

/// How long a client may take over its TLS handshake. Handshakes run on
/// tasks of their own, so a slow one never holds up the next accept.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// After a failed accept (out of file descriptors, say), wait this long
/// before the next, instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Handshaken connections waiting for tonic to take them.
const READY_QUEUE: usize = 64;

/// Why the `[tls]` files cannot serve: the field, its file, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("[tls] {field} {}: {reason}", path.display())]
pub struct TlsError {
    /// `cert`, `key` or `client_ca`.
    pub field: &'static str,
    pub path: PathBuf,
    pub reason: String,
}

/// The TLS side of the gRPC port: a handle on the server config in force,
/// cheap to clone, shared by the acceptor and the SIGHUP reloader.
#[derive(Clone)]
pub struct Tls {
    current: Arc<ArcSwap<ServerConfig>>,
}

impl Tls {
    /// Reads the `[tls]` files; an error names the file and what is wrong.
    pub fn load(config: &TlsConfig) -> Result<Tls, TlsError> {
        Ok(Tls {
            current: Arc::new(ArcSwap::from(server_config(config)?)),
        })
    }

    /// Re-reads the files of `config`; new connections use them. On an error
    /// the certificates in force stay, and the error is returned.
    pub fn reload(&self, config: &TlsConfig) -> Result<(), TlsError> {
        self.current.store(server_config(config)?);
        Ok(())
    }

    /// The TLS connections of `listener` (with TCP_NODELAY), for tonic's
    /// `serve_with_incoming_shutdown`. Accepting stops when the stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
        let (ready, incoming) = mpsc::channel(READY_QUEUE);
        tokio::spawn(accept_loop(listener, self.current.clone(), ready));
        ReceiverStream::new(incoming)
    }
}

/// Applies the `[tls]` table of a reloaded config to `tls`, the TLS in force
/// (`None`: the port is plaintext), and logs what happened. Turning TLS on or
/// off takes a restart.
pub fn reload(tls: Option<&Tls>, config: Option<&TlsConfig>) {
    match (tls, config) {
        (Some(tls), Some(config)) => match tls.reload(config) {
            Ok(()) => tracing::info!("TLS certificates reloaded"),
            Err(err) => {
                tracing::error!(%err, "TLS reload failed; keeping the certificates in force")
            }
        },
        (Some(_), None) => {
            tracing::warn!("[tls] was removed; TLS stays on until the service restarts")
        }
        (None, Some(_)) => {
            tracing::warn!("[tls] was added; the port stays plaintext until the service restarts")
        }
        (None, None) => {}
    }
}

/// Accepts TCP connections and runs each handshake on a task of its own;
/// those that succeed go to `ready`. Ends when `ready`'s receiver is gone.
async fn accept_loop(
    listener: TcpListener,
    configs: Arc<ArcSwap<ServerConfig>>,
    ready: mpsc::Sender<io::Result<TlsStream<TcpStream>>>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(%err, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // No Nagle: a small reply must not wait for the peer's delayed ACK.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, %err, "cannot set TCP_NODELAY");
        }
        // The config in force now: a reload affects the connections after it.
        let acceptor = TlsAcceptor::from(configs.load_full());
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    // A failed send: the server has stopped taking connections.
                    let _ = ready.send(Ok(stream)).await;
                }
                Ok(Err(err)) => tracing::debug!(%peer, %err, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// The rustls server config of `config`: its certificate chain and key,
/// client certificates required when `client_ca` is set, and ALPN `h2`.
fn server_config(config: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs("cert", &config.cert)?;
    let key = read_key(&config.key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| file_error("cert", &config.cert, format!("no TLS version fits: {e}")))?;
    let builder = match &config.client_ca {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
        None => builder.with_no_client_auth(),
    };
    let mut server = builder.with_single_cert(chain, key).map_err(|e| {
        let reason = format!("does not go with key {}: {e}", config.key.display());
        file_error("cert", &config.cert, reason)
    })?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(server))
}

/// Verifies client certificates against the CA certificates in `path`.
fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs("client_ca", path)? {
        roots.add(cert).map_err(|e| {
            file_error(
                "client_ca",
                path,
                format!("holds a bad CA certificate: {e}"),
            )
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| file_error("client_ca", path, format!("cannot verify clients: {e}")))
}

/// The PEM certificates in `path`: at least one.
fn read_certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(field, path, format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(field, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The PEM private key in `path` (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let reason = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM private key".to_owned(),
            e => format!("is not a valid PEM private key: {e}"),
        };
        file_error("key", path, reason)
    })
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| file_error(field, path, format!("cannot be read: {e}")))
}

fn file_error(field: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError {
        field,
        path: path.to_owned(),
        reason: reason.into(),
    }
}
