//! The webhook kind: one signed HTTP POST per batch, following the Standard
//! Webhooks convention (`webhook-id`, `webhook-timestamp`,
//! `webhook-signature`), and what its answer means for the batch.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::secret::Signer;
use crate::config::WebhookOptions;

/// How much of a refused answer's body a dead letter keeps.
const EXCERPT_BYTES: usize = 256;
/// The most of an answer's body that is read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// A 2xx within the timeout: the batch is delivered.
    Accepted,
    /// A failure worth retrying (timeout, connection error, 5xx, 408, 429),
    /// with the delay the receiver asked for (`Retry-After`), if any.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// A failure no retry mends (any other status): dead-letter at once.
    Refused { why: String },
}

/// A webhook endpoint: where, how it is signed, and the client that posts.
pub struct Webhook {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: http::Uri,
    timeout: Duration,
    signer: Signer,
}

/// Why a webhook cannot be set up: the field and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("options.{field}: {reason}")]
pub struct SetupError {
    pub field: &'static str,
    pub reason: String,
}

impl Webhook {
    /// The endpoint of `options`, signing with `signer`: a client that
    /// follows no redirect (a signed batch goes where it was configured to
    /// go, or fails), and for https trusts the system roots plus `ca_file`,
    /// and presents the client certificate when given.
    pub fn new(options: &WebhookOptions, signer: Signer) -> Result<Webhook, SetupError> {
        let url = options
            .url
            .parse()
            .map_err(|err: http::uri::InvalidUri| SetupError {
                field: "url",
                reason: err.to_string(),
            })?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(options)?)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Webhook {
            client,
            url,
            timeout: options.timeout,
            signer,
        })
    }

    /// The signer, to compare two set-ups of one sink.
    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// POSTs `body` (a batch as JSON) as message `id`, signed now; the
    /// answer must come within the timeout.
    pub async fn post(&self, id: &str, body: Arc<[u8]>) -> Attempt {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let signature = self.signer.sign(id, timestamp, &body);
        let request = Request::post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(Full::new(Bytes::from(body.to_vec())));
        let request = match request {
            Ok(request) => request,
            Err(err) => {
                return Attempt::Refused {
                    why: err.to_string(),
                };
            }
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, answer) = response.into_parts();
            // A body past the limit, or cut off, leaves only the status.
            let answer = match Limited::new(answer, MAX_ANSWER_BYTES).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => Bytes::new(),
            };
            Ok::<_, hyper_util::client::legacy::Error>((parts.status, parts.headers, answer))
        };
        let (status, headers, answer) = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answered)) => answered,
            // The client's errors name no URL (which may carry credentials).
            Ok(Err(err)) => {
                let why = match std::error::Error::source(&err) {
                    Some(source) => format!("{err}: {source}"),
                    None => err.to_string(),
                };
                return Attempt::Retry { after: None, why };
            }
            Err(_) => {
                let why = format!(
                    "no answer within {}",
                    humantime::format_duration(self.timeout)
                );
                return Attempt::Retry { after: None, why };
            }
        };
        if status.is_success() {
            return Attempt::Accepted;
        }
        let why = format!("status {}: {}", status.as_u16(), excerpt(&answer));
        if retryable(status) {
            let after = retry_after(&headers);
            Attempt::Retry { after, why }
        } else {
            Attempt::Refused { why }
        }
    }
}

/// 5xx, 408 and 429 may pass; every other status is the receiver's answer.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// A `Retry-After` as seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()?;
    let wait = at.duration_since(jiff::Timestamp::now());
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// The first [`EXCERPT_BYTES`] of an answer, as text, on one line.
fn excerpt(body: &[u8]) -> String {
    let cut = &body[..body.len().min(EXCERPT_BYTES)];
    String::from_utf8_lossy(cut)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The rustls set-up of the client: ring, the system roots and `ca_file`,
/// and the client certificate when configured.
fn tls_config(options: &WebhookOptions) -> Result<rustls::ClientConfig, SetupError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    // Certificates the system store holds but rustls cannot parse are skipped.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &options.ca_file {
        let certs = read_certs(path).map_err(|reason| SetupError {
            field: "ca_file",
            reason,
        })?;
        for cert in certs {
            roots.add(cert).map_err(|err| SetupError {
                field: "ca_file",
                reason: err.to_string(),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| SetupError {
            field: "url",
            reason: err.to_string(),
        })?
        .with_root_certificates(roots);
    let config = match (&options.client_cert_file, &options.client_key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert).map_err(|reason| SetupError {
                field: "client_cert_file",
                reason,
            })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|err| SetupError {
                field: "client_key_file",
                reason: err.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|err| SetupError {
                    field: "client_cert_file",
                    reason: err.to_string(),
                })?
        }
        _ => builder.with_no_client_auth(),
    };
    return Ok(config);

    fn read_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        match certs.is_empty() {
            true => Err(format!("{}: holds no PEM certificate", path.display())),
            false => Ok(certs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 5xx, 408 and 429 are retried; other 4xx and 3xx are not.
    #[test]
    fn which_statuses_are_retried() {
        for code in [500, 502, 503, 408, 429] {
            assert!(retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422, 301] {
            assert!(!retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    /// `Retry-After` in seconds and as an HTTP date; garbage is ignored.
    #[test]
    fn retry_after_forms() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            RETRY_AFTER,
            "Thu, 01 Jan 1970 00:00:01 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO), "a date past");
        headers.insert(RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}
