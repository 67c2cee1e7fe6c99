//! One deadline per call, whatever number of Redis commands the call issues.
//!
//! [`Deadlines`] wraps the Batcher gRPC service. For each request it sets a
//! [`Deadline`]: the smaller of the client's `grpc-timeout` and the configured
//! `[redis] response_timeout` (for ImportPolicies, at least 60 s). Handlers find it in the request's extensions
//! (the add path hands it to the shard writers, which drop a queued add whose
//! deadline passed). When the handler has not answered by then, the call
//! fails UNAVAILABLE (`REDIS_TIMEOUT`): all a handler waits on is Redis, or its
//! shard's queue to Redis. For Subscribe it covers joining the consumer group
//! and finding the start position, not the stream that follows.
//!
//! Once a drain refuses calls, it answers each UNAVAILABLE (`SHUTTING_DOWN`)
//! without calling the service.
//!
//! It also gives tonic's refusal of a request over `[limits]
//! max_message_bytes` (OUT_OF_RANGE, without details) the code gRPC uses
//! for it elsewhere, RESOURCE_EXHAUSTED, with an `ErrorInfo`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower_service::Service;

use super::Error;
use crate::store::Deadline;

/// The deadline of ImportPolicies, when `response_timeout` is shorter: an
/// import of 100k policies checks and stages them all, in many short Redis
/// commands.
const IMPORT_LIMIT: Duration = Duration::from_secs(60);

/// The Batcher service `S`, with one deadline per call.
#[derive(Clone)]
pub struct Deadlines<S> {
    inner: S,
    /// The configured deadline; a client may only shorten it.
    limit: Duration,
    /// Cancelled when the drain refuses calls (see `crate::drain`): a call
    /// that arrives then, on a connection the GOAWAY has not reached yet,
    /// is refused UNAVAILABLE, which clients retry on another instance.
    refusing: CancellationToken,
}

impl<S> Deadlines<S> {
    /// Wraps `inner`, giving each call at most `limit`.
    pub fn new(inner: S, limit: Duration) -> Deadlines<S> {
        Deadlines {
            inner,
            limit,
            refusing: CancellationToken::new(),
        }
    }

    /// Refuses every call UNAVAILABLE once `refusing` is cancelled.
    pub fn refusing_after(self, refusing: CancellationToken) -> Deadlines<S> {
        Deadlines { refusing, ..self }
    }
}

impl<S: NamedService> NamedService for Deadlines<S> {
    const NAME: &'static str = S::NAME;
}

type Reply = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl<S, B> Service<http::Request<B>> for Deadlines<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Reply;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Reply {
        if self.refusing.is_cancelled() {
            let refused = Error::refused(
                Code::Unavailable,
                "SHUTTING_DOWN",
                "this instance is shutting down; retry on another instance",
            );
            return Box::pin(std::future::ready(Ok(Status::from(refused).into_http())));
        }
        let limit = match request.uri().path().ends_with("/ImportPolicies") {
            true => self.limit.max(IMPORT_LIMIT),
            false => self.limit,
        };
        let deadline = Deadline::after(budget(request.headers(), limit));
        request.extensions_mut().insert(deadline);
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = match tokio::time::timeout_at(deadline.at, call).await {
                Ok(response) => response?,
                Err(_) => {
                    crate::metrics::redis_timeout();
                    Status::from(Error::Store(deadline.expired())).into_http()
                }
            };
            Ok(too_large_is_exhausted(response))
        })
    }
}

/// The time a call may take: `limit`, or less when the client's
/// `grpc-timeout` is shorter. Then a little less than the client's: tonic
/// answers CANCELLED when the client's time is up, and the client should
/// hear why instead.
fn budget(headers: &http::HeaderMap, limit: Duration) -> Duration {
    let client = headers
        .get("grpc-timeout")
        .and_then(|value| parse_grpc_timeout(value.to_str().ok()?));
    match client {
        Some(client) => {
            let slack = (client / 10).min(Duration::from_millis(200));
            limit.min(client - slack)
        }
        None => limit,
    }
}

/// A `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n),
/// as the gRPC over HTTP/2 spec has it. tonic parses it too, but privately.
fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(value * 3600),
        'M' => Duration::from_secs(value * 60),
        'S' => Duration::from_secs(value),
        'm' => Duration::from_millis(value),
        'u' => Duration::from_micros(value),
        'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

/// tonic's refusal of a request over the decoding limit, as RESOURCE_EXHAUSTED
/// (`MESSAGE_TOO_LARGE`) with its message kept; any other response as it is.
fn too_large_is_exhausted(response: http::Response<Body>) -> http::Response<Body> {
    match Status::from_header_map(response.headers()) {
        Some(status)
            if status.code() == Code::OutOfRange
                && status
                    .message()
                    .starts_with("Error, decoded message length too large") =>
        {
            let refused = Error::refused(
                Code::ResourceExhausted,
                "MESSAGE_TOO_LARGE",
                status.message(),
            );
            Status::from(refused).into_http()
        }
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// grpc-timeout values parse in every unit; malformed ones are ignored.
    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "123456789S", "5s", "-1S", "1.5S", "5é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    /// A service that answers every call OK, and counts the calls it got.
    #[derive(Clone, Default)]
    struct Answers(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Service<http::Request<()>> for Answers {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Ok(Status::ok("").into_http()))
        }
    }

    /// Once the drain refuses calls, a call is answered UNAVAILABLE
    /// (`SHUTTING_DOWN`) without reaching the service; before, it reaches it.
    #[tokio::test]
    async fn a_closing_drain_refuses_calls_unavailable() {
        let answers = Answers::default();
        let refusing = CancellationToken::new();
        let mut service = Deadlines::new(answers.clone(), Duration::from_secs(2))
            .refusing_after(refusing.clone());
        let status = |response: http::Response<Body>| Status::from_header_map(response.headers());
        let served = service.call(http::Request::new(())).await.unwrap();
        assert_eq!(status(served).map(|s| s.code()), Some(Code::Ok));
        refusing.cancel();
        let refused = status(service.call(http::Request::new(())).await.unwrap()).unwrap();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert!(refused.message().contains("shutting down"), "{refused:?}");
        assert_eq!(answers.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The budget is the configured limit, or a little less than a shorter
    /// client timeout.
    #[test]
    fn budget_is_the_smaller() {
        let limit = Duration::from_secs(2);
        let mut headers = http::HeaderMap::new();
        assert_eq!(budget(&headers, limit), limit);
        headers.insert("grpc-timeout", "5S".parse().unwrap());
        assert_eq!(budget(&headers, limit), limit);
        headers.insert("grpc-timeout", "500m".parse().unwrap());
        assert_eq!(budget(&headers, limit), Duration::from_millis(450));
        headers.insert("grpc-timeout", "2100m".parse().unwrap());
        assert_eq!(budget(&headers, limit), Duration::from_millis(1900));
        headers.insert("grpc-timeout", "junk".parse().unwrap());
        assert_eq!(budget(&headers, limit), limit);
    }
}
