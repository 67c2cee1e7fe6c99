//! Reaching the service: the address (with or without a scheme), TLS (a CA,
//! a client certificate for mutual TLS, the name to check), the bearer
//! token on every call, a time limit on each one-shot call, and the CLI's
//! errors, which print a status as its gRPC code, message and details.

use std::future::Future;
use std::path::Path;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use super::Remote;
use crate::pb::batcher_client::BatcherClient;

/// Where the CLI looks for the service when neither `--addr` nor
/// `BATCHER_ADDR` says: `serve`'s default `listen`.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// A Batcher client that sends the bearer token, if any, on every call.
pub type Client = BatcherClient<InterceptedService<Channel, Bearer>>;

/// The CLI's errors; each prints as one or a few lines after `batcher: `.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The service answered with an error status (boxed: a status is large).
    #[error("{}", describe(.0))]
    Status(Box<Status>),
    /// No connection to the service.
    #[error("UNAVAILABLE: cannot connect to {addr}: {}", chain(.source))]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    /// Bad input caught before any call (a file that cannot be read, an
    /// address that does not parse).
    #[error("{0}")]
    Input(String),
    /// A config file that does not load, as `serve` reports it.
    #[error(transparent)]
    Config(Box<crate::config::ConfigError>),
    /// Writing to stdout failed (a closed pipe ends the CLI quietly).
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// `policy diff --exit-code` found differences (it printed them; the
    /// CLI exits 1 without a message).
    #[error("differences found")]
    Differences,
}

impl From<Status> for CliError {
    fn from(status: Status) -> CliError {
        CliError::Status(Box::new(status))
    }
}

impl From<crate::config::ConfigError> for CliError {
    fn from(err: crate::config::ConfigError) -> CliError {
        CliError::Config(Box::new(err))
    }
}

impl CliError {
    /// Whether a tail should reconnect after this error: the service or the
    /// network may come back; a refused or invalid request would not change.
    pub fn is_transient(&self) -> bool {
        match self {
            CliError::Connect { .. } => true,
            CliError::Status(status) => !matches!(
                status.code(),
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::AlreadyExists
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::Unimplemented
            ),
            CliError::Input(_)
            | CliError::Config(_)
            | CliError::Output(_)
            | CliError::Differences => false,
        }
    }
}

/// Puts `authorization: Bearer <token>` on every call (nothing with `None`).
#[derive(Clone)]
pub struct Bearer(pub Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

impl Remote {
    /// The endpoint `--addr` and the TLS flags describe; nothing connects yet.
    pub fn endpoint(&self) -> Result<Endpoint, CliError> {
        let tls = self.tls_ca.is_some() || self.addr.starts_with("https://");
        let url = match self.addr.contains("://") {
            true => self.addr.clone(),
            false if tls => format!("https://{}", self.addr),
            false => format!("http://{}", self.addr),
        };
        if self.tls_ca.is_some() && !url.starts_with("https://") {
            return Err(CliError::Input(format!(
                "--tls-ca needs an https:// address (or HOST:PORT), not {url}"
            )));
        }
        if self.tls_cert.is_some() && !tls {
            return Err(CliError::Input(
                "--tls-cert needs TLS: give --tls-ca or an https:// address".into(),
            ));
        }
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| CliError::Input(format!("--addr {url}: {e}")))?
            .connect_timeout(self.timeout);
        if !tls {
            return Ok(endpoint);
        }
        endpoint
            .tls_config(self.tls_config()?)
            .map_err(|e| CliError::Input(format!("TLS: {}", chain(&e))))
    }

    /// The client TLS settings of the flags.
    fn tls_config(&self) -> Result<ClientTlsConfig, CliError> {
        let mut tls = ClientTlsConfig::new();
        tls = match &self.tls_ca {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?)),
            None => tls.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let identity = Identity::from_pem(read("--tls-cert", cert)?, read("--tls-key", key)?);
            tls = tls.identity(identity);
        }
        if let Some(domain) = &self.tls_domain {
            tls = tls.domain_name(domain);
        }
        Ok(tls)
    }

    /// A connected client, or an error naming the address.
    pub async fn connect(&self) -> Result<Client, CliError> {
        let endpoint = self.endpoint()?;
        let bearer = match &self.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| CliError::Input("--token: not a valid header value".into()))?,
            ),
            None => None,
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| CliError::Connect {
                addr: endpoint.uri().to_string(),
                source,
            })?;
        Ok(BatcherClient::with_interceptor(channel, Bearer(bearer)))
    }

    /// Awaits a one-shot call, for at most `--timeout`.
    pub async fn call<T>(
        &self,
        call: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, CliError> {
        self.within(async { Ok(call.await?.into_inner()) }).await
    }

    /// Awaits `work` (calls of the service), for at most `--timeout`.
    pub async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, CliError> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {}",
                humantime::format_duration(self.timeout)
            ))
            .into()),
        }
    }
}

/// The bytes of `path`, or an error naming the flag.
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::Input(format!("{flag} {}: {e}", path.display())))
}

/// `error` and its sources, joined by ": ".
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(next) = source {
        let part = next.to_string();
        // hyper repeats its own message one level down
        if !parts.contains(&part) {
            parts.push(part);
        }
        source = next.source();
    }
    parts.join(": ")
}

/// A status as people read it: `CODE: message`, then the `ErrorInfo`
/// reason and metadata, then every field violation after the first (the
/// message already names the first).
pub fn describe(status: &Status) -> String {
    let mut text = format!("{}: {}", code_name(status.code()), status.message());
    // A transport failure keeps its cause (a refused handshake, a reset)
    // below the status; say it, unless the message already does.
    if let Some(cause) = std::error::Error::source(status).map(chain)
        && !status.message().contains(&cause)
    {
        text.push_str(&format!(": {cause}"));
    }
    let details = status.get_error_details();
    if let Some(info) = details.error_info() {
        let mut metadata = info.metadata.iter().collect::<Vec<_>>();
        metadata.sort();
        text.push_str(&format!("\n  reason: {} ({})", info.reason, info.domain));
        for (key, value) in metadata {
            text.push_str(&format!(" {key}={value}"));
        }
    }
    if let Some(bad) = details.bad_request() {
        for violation in bad.field_violations.iter().skip(1) {
            let (field, message) = (&violation.field, &violation.description);
            text.push_str(&format!("\n  {field}: {message}"));
        }
    }
    text
}

/// A gRPC code in the spelling of the spec: `INVALID_ARGUMENT` (from the
/// variant name `InvalidArgument`).
pub fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes print as the spec names them.
    #[test]
    fn code_names() {
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
        assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
    }
}
