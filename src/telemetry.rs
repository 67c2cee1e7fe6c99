//! OpenTelemetry traces, exported over OTLP/gRPC: on when the standard
//! `OTEL_*` environment names an OTLP endpoint, off otherwise (see
//! `docs/tracing.md`).
//!
//! Three kinds of span. An `Add` or `AddMany` call whose gRPC metadata
//! carries a W3C `traceparent` gets a server span, a child of it; an
//! AddMany item with its own context (`AddRequest.trace_context`) gets a
//! span of its own, a child of that. The item keeps its span's context
//! in its ext while it waits in its group (see `store::ext`). The instance
//! whose script flushed a batch (add path, sweeper or Flush) emits the
//! batch's flush span, which links to every item's context (the first
//! [`MAX_LINKS`]) and whose ids derive from the batch's key and id, so that
//! every instance gives a subscriber the same `Batch.trace_context`.
//!
//! Off, the add path pays one atomic load ([`on`]) and nothing else: no
//! metadata is read and an item's ext is what it always was.

use std::cell::Cell;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::batch::{Batch, TraceContext};
use crate::pb;

/// Most links a flush span carries; the number of items' contexts left
/// out is its `batcher.batch.links_dropped` attribute. The SDK's own
/// default limit (`OTEL_SPAN_LINK_COUNT_LIMIT`) is the same.
pub const MAX_LINKS: usize = 128;

/// The gRPC metadata key of a W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The tracer, set once by [`Telemetry::from_env`] when tracing is on.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether tracing is on: one atomic load, all the add path pays when off.
#[inline]
pub fn on() -> bool {
    TRACER.get().is_some()
}

/// Why tracing could not be set up as the environment asks.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{name}={value:?}: only OTLP over gRPC (\"grpc\") is built in")]
    Protocol { name: &'static str, value: String },
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("tracing is already set up in this process")]
    AlreadySet,
}

/// Whether the environment `var` turns tracing on: an OTLP endpoint
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`)
/// is set, `OTEL_SDK_DISABLED` is not `true` and `OTEL_TRACES_EXPORTER` is
/// not `none`.
pub fn wanted(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let is =
        |name: &str, word: &str| var(name).is_some_and(|v| v.trim().eq_ignore_ascii_case(word));
    (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// Tracing, when on: the tracer provider, which exports spans in batches
/// from a thread of its own, and flushes what is left on [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Sets up tracing as the process's `OTEL_*` environment says: None
    /// when it is off (see [`wanted`]). The exporter takes its endpoint,
    /// headers, timeout and compression from the environment, the batch
    /// processor its delays and sizes (`OTEL_BSP_*`), the SDK its sampler
    /// and limits; the resource is `service.name = batcher` unless
    /// `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` name one. Must run
    /// inside a Tokio runtime (the gRPC channel's task lives there).
    pub fn from_env() -> Result<Option<Telemetry>, TelemetryError> {
        let var = |name: &str| std::env::var(name).ok();
        if !wanted(var) {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = var(name).filter(|v| v.trim() != "grpc") {
                return Err(TelemetryError::Protocol { name, value });
            }
        }
        use opentelemetry_otlp::WithExportConfig as _;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(opentelemetry_otlp::Protocol::Grpc)
            .build()?;
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
        let resource = match named {
            true => Resource::builder().build(),
            false => Resource::builder().with_service_name("batcher").build(),
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .with_id_generator(Ids::default())
            .build();
        let scope = InstrumentationScope::builder("batcher")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        TRACER
            .set(provider.tracer_with_scope(scope))
            .map_err(|_| TelemetryError::AlreadySet)?;
        Ok(Some(Telemetry { provider }))
    }

    /// The `tracing` layer that turns this crate's spans (the add spans)
    /// into OpenTelemetry spans, and the events logged inside them into
    /// span events. Give it a filter of its own (the `batcher` target).
    pub fn layer<S>(&self) -> tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let tracer = TRACER.get().cloned();
        tracing_opentelemetry::layer()
            .with_tracer(tracer.unwrap_or_else(|| self.provider.tracer("batcher")))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_target(false)
    }

    /// Exports the spans still buffered, within `grace`.
    pub async fn shutdown(self, grace: Duration) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(grace));
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "traces: the last spans were not all exported"),
            Err(err) => tracing::warn!(%err, "traces: shutdown failed"),
        }
    }
}

/// Span and trace ids: random, except for a flush span, whose ids
/// [`flushed`] sets for the one span it starts on this thread.
#[derive(Debug, Default)]
struct Ids {
    random: RandomIdGenerator,
}

thread_local! {
    /// The ids the next span started on this thread takes, when set.
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        match NEXT_IDS.get() {
            Some((trace, _)) => trace,
            None => self.random.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        match NEXT_IDS.get() {
            Some((_, span)) => span,
            None => self.random.new_span_id(),
        }
    }
}

/// The context of a batch's flush span: ids from a hash of the batch's key
/// and id (a re-driven copy keeps its original's id, so its context too),
/// flags sampled.
pub fn batch_context(batch: &Batch) -> TraceContext {
    let mut hash = Sha256::new();
    hash.update(b"batcher flush\0");
    hash.update(batch.key.as_bytes());
    hash.update(b"\0");
    hash.update(batch.id().as_bytes());
    let digest = hash.finalize();
    let mut context = TraceContext {
        trace_id: digest[..16].try_into().unwrap_or_default(),
        span_id: digest[16..24].try_into().unwrap_or_default(),
        flags: 1,
    };
    // A zero id is invalid; a hash gives one once in 2^64 batches.
    context.trace_id[15] |= u8::from(context.trace_id == [0; 16]);
    context.span_id[7] |= u8::from(context.span_id == [0; 8]);
    context
}

/// A batch's `trace_context` for the wire: its flush span's `traceparent`
/// with tracing on, empty with it off.
pub fn traceparent(batch: &Batch) -> String {
    match on() {
        true => batch_context(batch).traceparent(),
        false => String::new(),
    }
}

/// Emits the flush span of a batch this instance's script wrote: from its
/// group's opening to its flush (Redis clock), with the batch's id, key,
/// reason and size, and a link to each item's context, at most
/// [`MAX_LINKS`]. Nothing with tracing off.
pub fn flushed(batch: &Batch) {
    let Some(tracer) = TRACER.get() else {
        return;
    };
    let traced = batch.items.iter().filter_map(|item| item.trace);
    let links: Vec<Link> = traced
        .clone()
        .take(MAX_LINKS)
        .map(|trace| Link::with_context(span_context(trace, true)))
        .collect();
    let dropped = traced.count() - links.len();
    let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    let context = batch_context(batch);
    let builder = tracer
        .span_builder("batcher.flush")
        .with_kind(SpanKind::Producer)
        .with_start_time(at(batch.opened_at_ms))
        .with_links(links)
        .with_attributes([
            KeyValue::new("batcher.batch.id", batch.id()),
            KeyValue::new("batcher.batch.key", batch.key.clone()),
            KeyValue::new("batcher.batch.reason", batch.reason.as_str()),
            KeyValue::new("batcher.batch.size", batch.items.len() as i64),
            KeyValue::new("batcher.batch.links_dropped", dropped as i64),
        ]);
    let ids = (
        TraceId::from_bytes(context.trace_id),
        SpanId::from_bytes(context.span_id),
    );
    NEXT_IDS.set(Some(ids));
    // A root: no parent, whatever span is current on this thread.
    let mut span = builder.start_with_context(tracer, &Context::new());
    NEXT_IDS.set(None);
    span.end_with_timestamp(at(batch.flushed_at_ms).max(at(batch.opened_at_ms)));
}

/// An OpenTelemetry span context of ours.
fn span_context(trace: TraceContext, remote: bool) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(trace.trace_id),
        SpanId::from_bytes(trace.span_id),
        TraceFlags::new(trace.flags),
        remote,
        TraceState::NONE,
    )
}

/// Ours, from an OpenTelemetry span context; None if it is not valid (the
/// `tracing` layer is missing).
fn trace_context(context: &SpanContext) -> Option<TraceContext> {
    context.is_valid().then(|| TraceContext {
        trace_id: context.trace_id().to_bytes(),
        span_id: context.span_id().to_bytes(),
        flags: context.trace_flags().to_u8(),
    })
}

/// A span of an add: the server span of an `Add` or `AddMany` call, or
/// the span of one AddMany item with a context of its own. Ends when
/// dropped.
pub struct AddSpan {
    span: tracing::Span,
    /// The span's context, which the item keeps.
    context: TraceContext,
}

impl AddSpan {
    /// The server span of a call (`method`: `Add` or `AddMany`), a child
    /// of `own` (the request's `trace_context`) if not empty, else of the
    /// `traceparent` in its `metadata`; None with tracing off or no valid
    /// context.
    pub fn of_call(
        metadata: &tonic::metadata::MetadataMap,
        method: &str,
        own: &str,
    ) -> Option<AddSpan> {
        if !on() {
            return None;
        }
        let parent = match own {
            "" => metadata.get(TRACEPARENT)?.to_str().ok()?,
            own => own,
        };
        let parent = TraceContext::from_traceparent(parent)?;
        let span = tracing::info_span!(
            "add",
            otel.name = %format_args!("batcher.v1.Batcher/{method}"),
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = "batcher.v1.Batcher",
            rpc.method = method,
        );
        AddSpan::started(span, parent)
    }

    /// The span of AddMany's item `key`/`id` whose own context is
    /// `traceparent`, a child of it, linked to the call's span `call` if
    /// any; None with tracing off or no valid context.
    pub fn of_item(
        traceparent: &str,
        call: Option<&AddSpan>,
        key: &str,
        id: &str,
    ) -> Option<AddSpan> {
        if !on() {
            return None;
        }
        let parent = TraceContext::from_traceparent(traceparent)?;
        let span = tracing::info_span!(
            "add",
            otel.name = "batcher.add",
            otel.kind = "server",
            batcher.key = key,
            batcher.item.id = id,
        );
        if let Some(call) = call {
            span.add_link(span_context(call.context, false));
        }
        AddSpan::started(span, parent)
    }

    fn started(span: tracing::Span, parent: TraceContext) -> Option<AddSpan> {
        let remote = Context::new().with_remote_span_context(span_context(parent, true));
        span.set_parent(remote).ok()?;
        let context = trace_context(span.context().span().span_context())?;
        Some(AddSpan { span, context })
    }

    /// The context the added item keeps.
    pub fn context(&self) -> TraceContext {
        self.context
    }

    /// Names the item a call's span added (an `Add`).
    pub fn item(&self, key: &str, id: &str) {
        self.span.set_attribute("batcher.key", key.to_owned());
        self.span.set_attribute("batcher.item.id", id.to_owned());
    }

    /// Records what the add did: its outcome, the group's size after it
    /// and the last batch it flushed; or its error.
    pub fn finish(self, result: Result<&pb::AddResponse, &tonic::Status>) {
        match result {
            Ok(response) => {
                let outcome = response.outcome().as_str_name();
                let outcome = outcome.trim_start_matches("ADD_OUTCOME_");
                self.span.set_attribute("batcher.outcome", outcome);
                self.span
                    .set_attribute("batcher.group_size", i64::from(response.group_size));
                if let Some(batch) = &response.flushed {
                    self.span
                        .set_attribute("batcher.batch.id", batch.id.clone());
                }
            }
            Err(status) => {
                self.span
                    .set_status(Status::error(status.message().to_owned()));
                self.span
                    .set_attribute("rpc.grpc.status_code", status.code() as i64);
            }
        }
    }

    /// Ends the span of a call that added many items: their count, or its
    /// error.
    pub fn finish_many(self, result: Result<usize, &tonic::Status>) {
        match result {
            Ok(count) => self.span.set_attribute("batcher.items", count as i64),
            Err(status) => {
                self.span
                    .set_status(Status::error(status.message().to_owned()));
                self.span
                    .set_attribute("rpc.grpc.status_code", status.code() as i64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{FlushReason, StreamId};

    /// Tracing is on only with an OTLP endpoint, and OTEL_SDK_DISABLED=true
    /// or OTEL_TRACES_EXPORTER=none turn it off.
    #[test]
    fn on_only_with_an_endpoint() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(!wanted(env(&[])));
        assert!(!wanted(env(&[("OTEL_SERVICE_NAME", "b")])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4317"
        )])));
        assert!(!wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")])));
        assert!(!wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "false"),
        ])));
        assert!(!wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }

    fn batch(key: &str, ms: u64) -> Batch {
        Batch {
            shard: 3,
            stream_id: StreamId { ms, seq: 0 },
            key: key.into(),
            items: Vec::new(),
            reason: FlushReason::Size,
            opened_at_ms: ms,
            flushed_at_ms: ms,
            origin: None,
            for_group: None,
        }
    }

    /// A batch's context is the same wherever it is computed, differs
    /// from batch to batch, and a re-driven copy has its original's.
    #[test]
    fn batch_contexts_derive_from_the_batch() {
        let a = batch_context(&batch("north", 1));
        assert_eq!(a, batch_context(&batch("north", 1)));
        assert_ne!(a.trace_id, batch_context(&batch("north", 2)).trace_id);
        assert_ne!(a.trace_id, batch_context(&batch("south", 1)).trace_id);
        let mut copy = batch("north", 9);
        copy.origin = Some(StreamId { ms: 1, seq: 0 });
        assert_eq!(batch_context(&copy), a);
        assert_eq!(a.flags, 1);
        assert!(TraceContext::from_traceparent(&a.traceparent()).is_some());
        assert_eq!(traceparent(&batch("north", 1)), "", "tracing is off here");
    }
}
