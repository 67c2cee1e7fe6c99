//! Counts and times the calls of the Batcher API. [`Requests`] wraps the
//! generated gRPC service (not the whole server), so health checks and
//! reflection are not counted.
//!
//! A call is counted when its response begins: a unary call when it has
//! finished, a Subscribe when its stream starts. The code is the
//! `grpc-status` of a trailers-only response (how an error is sent), else
//! `OK`. The method is one of the service's own (read from the proto
//! descriptors), or `other`, so clients cannot mint label values.

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use ::metrics::{Counter, Histogram, counter, histogram};
use prost::Message;
use tonic::Code;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use super::{REQUEST_DURATION, REQUESTS};
use crate::pb;

/// The Batcher service, counted and timed per call.
#[derive(Clone, Debug)]
pub struct Requests<S> {
    inner: S,
}

impl<S> Requests<S> {
    pub fn new(inner: S) -> Requests<S> {
        Requests { inner }
    }
}

impl<S: NamedService> NamedService for Requests<S> {
    const NAME: &'static str = S::NAME;
}

type ResponseFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Requests<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<http::Response<R>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            let code = match &response {
                Ok(response) => code_label(response.headers()),
                Err(_) => Code::Unknown,
            };
            record_call(method, code, started);
            response
        })
    }
}

/// The Batcher service's method names, from the proto descriptors.
static METHODS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET)
        .expect("the built-in descriptor set decodes");
    set.file
        .iter()
        .flat_map(|file| file.service.iter().map(move |s| (file.package(), s)))
        .filter(|(package, service)| {
            format!("{package}.{}", service.name()) == pb::batcher_server::SERVICE_NAME
        })
        .flat_map(|(_, service)| service.method.iter().map(|m| m.name().to_owned()))
        .collect()
});

/// Per method of [`METHODS`], in its order: the counter of its calls
/// answered OK and its duration histogram, so that the usual call looks up
/// no key in the registry.
static OK_CALLS: LazyLock<Vec<(Counter, Histogram)>> = LazyLock::new(|| {
    super::handle();
    METHODS
        .iter()
        .map(|m| {
            let method = m.as_str();
            (
                counter!(REQUESTS, "method" => method, "code" => code_name(Code::Ok)),
                histogram!(REQUEST_DURATION, "method" => method),
            )
        })
        .collect()
});

/// The `method` label of a request path `/<service>/<method>`.
fn method_label(path: &str) -> &'static str {
    let methods: &'static [String] = &METHODS;
    let name = path.rsplit('/').next().unwrap_or_default();
    methods
        .iter()
        .find(|m| *m == name)
        .map_or("other", String::as_str)
}

/// Counts a finished call of `method` (one of the service's own, or
/// `other`) and times it from `started`. The web API counts its calls here
/// too, under the gRPC method it calls.
pub fn record_call(method: &'static str, code: Code, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    if code == Code::Ok
        && let Some(at) = METHODS.iter().position(|m| m == method)
    {
        let (calls, duration) = &OK_CALLS[at];
        calls.increment(1);
        duration.record(seconds);
        return;
    }
    counter!(REQUESTS, "method" => method, "code" => code_name(code)).increment(1);
    histogram!(REQUEST_DURATION, "method" => method).record(seconds);
}

/// The code of a response: its `grpc-status` header, else OK.
fn code_label(headers: &http::HeaderMap) -> Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.parse::<i32>().ok())
        .map_or(Code::Ok, Code::from)
}

/// The name of a gRPC code, as in the `code` label: `INVALID_ARGUMENT`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths of the service's methods name them; anything else is `other`.
    #[test]
    fn method_labels_are_the_services_own() {
        assert_eq!(method_label("/batcher.v1.Batcher/Add"), "Add");
        assert_eq!(method_label("/batcher.v1.Batcher/Subscribe"), "Subscribe");
        assert_eq!(method_label("/batcher.v1.Batcher/Nonsense"), "other");
        assert!(METHODS.len() >= 10, "{:?}", *METHODS);
    }

    /// A trailers-only error names its code; no grpc-status header is OK.
    #[test]
    fn code_labels_come_from_grpc_status() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(code_name(code_label(&headers)), "OK");
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        assert_eq!(code_name(code_label(&headers)), "INVALID_ARGUMENT");
    }
}
