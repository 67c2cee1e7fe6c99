//! OpenTelemetry traces against a real OTLP receiver: a small OTLP/gRPC
//! trace collector started by the test records what `batcher serve` (a
//! child process, given the standard `OTEL_*` environment) exports, and the
//! tests read a batch's flush span and its links back from it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use batcher::pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;

use crate::support::{self, Process, RedisServer, config_text, eventually, next_batch};

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

/// `live` flushes at 5 items, `bulk` at 130 (past the flush span's 128
/// links), `late` after 300 ms, by the sweeper.
const POLICIES: &str = r#"
[defaults]
max_items = 5
max_wait = "1h"

[keys."bulk"]
max_items = 130

[keys."late"]
max_wait = "300ms"
"#;

/// An OTLP/gRPC trace receiver on a free port: it records every span it
/// gets, with its resource's `service.name`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct Recorder(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Recorder {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .as_ref()
                .and_then(|r| text_attribute(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let service = TraceServiceServer::new(Recorder(spans.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let shutdown = stop.clone().cancelled_owned();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown),
        );
        Receiver { addr, spans, stop }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Span> {
        let spans = self.spans.lock().unwrap();
        spans.iter().map(|(_, span)| span.clone()).collect()
    }

    /// Waits until spans named `name` satisfy `done`, and returns them.
    async fn wait_for(&self, name: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        eventually(&format!("the receiver to hold {name} spans"), || async {
            let spans: Vec<Span> = self
                .spans()
                .into_iter()
                .filter(|s| s.name == name)
                .collect();
            done(&spans).then_some(spans)
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A string attribute's value.
fn text_attribute(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|value| match value {
            Value::StringValue(s) => s,
            Value::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

/// The attributes of a span as text, by key.
fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), text_attribute(&span.attributes, &kv.key)?)))
        .collect()
}

/// `batcher serve` as a child process with `env` added to its environment
/// and every other `OTEL_*` name removed (the harness's `Process` passes
/// the test's environment on as it is).
async fn serve(redis: &RedisServer, dir: &Path, env: &[(&str, String)]) -> Process {
    let config = dir.join("batcher.toml");
    std::fs::write(&config, config_text(&redis.url(), POLICIES)).unwrap();
    let spawn = support::serve(&config, dir).env_remove_prefix("OTEL_");
    let spawn = env
        .iter()
        .fold(spawn, |spawn, (name, value)| spawn.env(name, value));
    spawn.start().await
}

/// The environment that turns tracing on, exporting to `receiver` every
/// 50 ms.
fn tracing_on(receiver: &Receiver) -> Vec<(&'static str, String)> {
    vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", receiver.addr),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
        ("OTEL_SERVICE_NAME", "batcher-under-test".to_owned()),
    ]
}

/// A W3C traceparent of a client's span: trace `t`, span `s` (hex digits
/// repeated), sampled.
fn parent(t: char, s: char) -> String {
    format!(
        "00-{}-{}-01",
        t.to_string().repeat(32),
        s.to_string().repeat(16)
    )
}

/// `request` with a `traceparent` in its metadata.
fn traced<T>(request: T, traceparent: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    let value = MetadataValue::try_from(traceparent).unwrap();
    request.metadata_mut().insert("traceparent", value);
    request
}

/// `request` with `trace_context` as its item's own context.
fn with_context(request: pb::AddRequest, trace_context: String) -> pb::AddRequest {
    pb::AddRequest {
        trace_context,
        ..request
    }
}

/// A live subscription to `keys`, open before anything is added.
async fn subscribe(client: &mut Client, keys: &[&str]) -> tonic::Streaming<pb::Batch> {
    let request = pb::SubscribeRequest {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        ..Default::default()
    };
    client.subscribe(request).await.unwrap().into_inner()
}

/// The one span of `spans` whose parent is the client span of `traceparent`.
fn child_of<'a>(spans: &'a [Span], traceparent: &str) -> &'a Span {
    let (trace, span) = ids(traceparent);
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == trace && s.parent_span_id == span)
        .collect();
    assert_eq!(found.len(), 1, "one span child of {traceparent}");
    found[0]
}

/// The trace id and span id of a traceparent, as bytes.
fn ids(traceparent: &str) -> (Vec<u8>, Vec<u8>) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    (
        hex::decode(parts[1]).unwrap(),
        hex::decode(parts[2]).unwrap(),
    )
}

/// `spans` as the receiver got them, one block each: name, kind, ids,
/// duration, attributes and links (printed by the test, for the docs).
fn dump(spans: &[&Span]) -> String {
    let mut out = String::new();
    for span in spans {
        let parent = match span.parent_span_id.is_empty() {
            true => "none".to_owned(),
            false => hex::encode(&span.parent_span_id),
        };
        let kind = format!("{:?}", span.kind())
            .replace("SpanKind", "")
            .to_uppercase();
        let ms = span
            .end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano)
            / 1_000_000;
        out += &format!(
            "{} ({kind}, {ms} ms)\n  trace {}  span {}  parent {parent}\n",
            span.name,
            hex::encode(&span.trace_id),
            hex::encode(&span.span_id),
        );
        let mut attrs: Vec<(String, String)> = attributes(span).into_iter().collect();
        attrs.sort();
        for (key, value) in attrs {
            out += &format!("  {key} = {value}\n");
        }
        for link in &span.links {
            let (trace, id) = (hex::encode(&link.trace_id), hex::encode(&link.span_id));
            out += &format!("  link -> trace {trace}  span {id}\n");
        }
    }
    out
}

/// The flush span of batch `id`.
fn flush_span_of<'a>(flushes: &'a [Span], id: &str) -> &'a Span {
    flushes
        .iter()
        .find(|s| attributes(s).get("batcher.batch.id").map(String::as_str) == Some(id))
        .unwrap_or_else(|| panic!("no flush span for batch {id}"))
}

/// With tracing on, a batch's flush span links to the span of each of its
/// items' adds (Add's server span from its metadata, AddMany's per-item
/// spans and its call span for an item without a context of its own), in
/// item order, capped at 128 with the rest counted; it names the batch's
/// id, key, reason and size; and the batch a subscriber receives carries
/// its context, whichever path flushed it (add path or sweeper).
#[tokio::test]
async fn a_batch_span_links_to_its_items_spans() {
    let redis = RedisServer::start();
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let process = serve(&redis, dir.path(), &tracing_on(&receiver)).await;
    let mut client = support::client(process.addr).await;
    let mut batches = subscribe(&mut client, &["live", "bulk", "late"]).await;

    five_items_link_in_order(&mut client, &mut batches, &receiver).await;
    links_stop_at_128(&mut client, &mut batches, &receiver).await;
    a_sweepers_flush_links_too(&mut client, &mut batches, &receiver).await;
    process.stop().await;
}

/// Two Adds and one AddMany of three complete a group of 5: its flush span
/// links each item's span in order, names the batch, and gives the batch
/// its context.
async fn five_items_link_in_order(
    client: &mut Client,
    batches: &mut tonic::Streaming<pb::Batch>,
    receiver: &Receiver,
) {
    for (id, traceparent) in [("p1", parent('1', 'a')), ("p2", parent('2', 'b'))] {
        let request = traced(support::add("live", id, b"{}"), &traceparent);
        client.add(request).await.unwrap();
    }
    let many = pb::AddManyRequest {
        items: [
            ("p3", parent('4', 'd')),
            ("p4", String::new()),
            ("p5", parent('5', 'e')),
        ]
        .into_iter()
        .map(|(id, context)| with_context(support::add("live", id, b"{}"), context))
        .collect(),
    };
    let response = client.add_many(traced(many, &parent('3', 'c'))).await;
    let flushed = response.unwrap().into_inner().results[2].flushed.clone();
    let flushed = flushed.expect("the fifth item flushed the group");
    let batch = next_batch(batches).await;
    assert_eq!((batch.items.len(), &batch.id), (5, &flushed.id));
    assert_eq!(
        batch.trace_context, flushed.trace_context,
        "one context per batch"
    );

    let adds = receiver
        .wait_for("batcher.v1.Batcher/Add", |s| s.len() == 2)
        .await;
    let calls = receiver
        .wait_for("batcher.v1.Batcher/AddMany", |s| s.len() == 1)
        .await;
    let items = receiver.wait_for("batcher.add", |s| s.len() == 2).await;
    let flushes = receiver.wait_for("batcher.flush", |s| !s.is_empty()).await;
    let expected: Vec<&Span> = vec![
        child_of(&adds, &parent('1', 'a')),
        child_of(&adds, &parent('2', 'b')),
        child_of(&items, &parent('4', 'd')),
        &calls[0],
        child_of(&items, &parent('5', 'e')),
    ];
    assert_eq!(
        child_of(&calls, &parent('3', 'c')).span_id,
        calls[0].span_id
    );
    let flush = flush_span_of(&flushes, &batch.id);
    check_flush_span(flush, &expected, &batch);
    let mut shown = expected.clone();
    shown.push(flush);
    println!(
        "the receiver's spans of batch {}:\n{}",
        batch.id,
        dump(&shown)
    );
    let services = receiver
        .spans
        .lock()
        .unwrap()
        .iter()
        .map(|(s, _)| s.clone())
        .collect::<Vec<_>>();
    assert!(
        services.iter().all(|s| s == "batcher-under-test"),
        "{services:?}"
    );
}

/// The flush span of the group of 5: a root span linking each item's span
/// in order, naming the batch, whose context the delivered batch carries.
fn check_flush_span(flush: &Span, expected: &[&Span], batch: &pb::Batch) {
    let links: Vec<(Vec<u8>, Vec<u8>)> = flush
        .links
        .iter()
        .map(|l| (l.trace_id.clone(), l.span_id.clone()))
        .collect();
    let items_spans: Vec<(Vec<u8>, Vec<u8>)> = expected
        .iter()
        .map(|s| (s.trace_id.clone(), s.span_id.clone()))
        .collect();
    assert_eq!(
        links, items_spans,
        "one link per item, to its add's span, in order"
    );
    let attrs = attributes(flush);
    assert_eq!(attrs["batcher.batch.key"], "live");
    assert_eq!(attrs["batcher.batch.reason"], "SIZE");
    assert_eq!(attrs["batcher.batch.size"], "5");
    assert_eq!(attrs["batcher.batch.links_dropped"], "0");
    assert_eq!(flush.parent_span_id, Vec::<u8>::new(), "a root span");
    assert_eq!(
        batch.trace_context,
        format!(
            "00-{}-{}-01",
            hex::encode(&flush.trace_id),
            hex::encode(&flush.span_id)
        ),
        "the subscriber's batch carries the flush span's context"
    );
    assert_eq!(attributes(expected[0])["batcher.outcome"], "ADDED");
    assert_eq!(attributes(expected[4])["batcher.batch.id"], batch.id);
}

/// 130 items with contexts of their own: 128 links, 2 counted as dropped.
async fn links_stop_at_128(
    client: &mut Client,
    batches: &mut tonic::Streaming<pb::Batch>,
    receiver: &Receiver,
) {
    let contexts: Vec<String> = (0..130)
        .map(|i| format!("00-{:032x}-{:016x}-01", 0xb000 + i, 0xc000 + i))
        .collect();
    let many = pb::AddManyRequest {
        items: contexts
            .iter()
            .enumerate()
            .map(|(i, c)| with_context(support::add("bulk", &format!("b{i}"), b""), c.clone()))
            .collect(),
    };
    client.add_many(many).await.unwrap();
    let bulk = next_batch(batches).await;
    assert_eq!((bulk.key.as_str(), bulk.items.len()), ("bulk", 130));
    let items = receiver.wait_for("batcher.add", |s| s.len() == 132).await;
    let flushes = receiver.wait_for("batcher.flush", |s| s.len() >= 2).await;
    let flush = flush_span_of(&flushes, &bulk.id);
    assert_eq!(flush.links.len(), 128);
    assert_eq!(attributes(flush)["batcher.batch.links_dropped"], "2");
    for (link, context) in flush.links.iter().zip(&contexts) {
        let item = child_of(&items, context);
        assert_eq!(link.span_id, item.span_id);
    }
}

/// A group the sweeper flushes: its span comes from the sweeper's flush.
async fn a_sweepers_flush_links_too(
    client: &mut Client,
    batches: &mut tonic::Streaming<pb::Batch>,
    receiver: &Receiver,
) {
    let request = traced(support::add("late", "l1", b""), &parent('6', 'f'));
    client.add(request).await.unwrap();
    let late = next_batch(batches).await;
    assert_eq!(late.key, "late");
    let adds = receiver
        .wait_for("batcher.v1.Batcher/Add", |s| s.len() == 3)
        .await;
    let flushes = receiver.wait_for("batcher.flush", |s| s.len() >= 3).await;
    let flush = flush_span_of(&flushes, &late.id);
    assert_eq!(attributes(flush)["batcher.batch.reason"], "TIMEOUT");
    let add = child_of(&adds, &parent('6', 'f'));
    assert_eq!(flush.links.len(), 1);
    assert_eq!(flush.links[0].span_id, add.span_id);
    assert_eq!(
        late.trace_context,
        format!(
            "00-{}-{}-01",
            hex::encode(&flush.trace_id),
            hex::encode(&flush.span_id)
        ),
    );
}

/// With tracing off (`OTEL_SDK_DISABLED=true` beside an endpoint), adds
/// that carry contexts export nothing, even at a clean shutdown, and the
/// batch's `trace_context` is empty.
#[tokio::test]
async fn off_exports_nothing() {
    let redis = RedisServer::start();
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = tracing_on(&receiver);
    env.push(("OTEL_SDK_DISABLED", "true".to_owned()));
    let process = serve(&redis, dir.path(), &env).await;
    let mut client = support::client(process.addr).await;
    let mut batches = subscribe(&mut client, &["live"]).await;
    for i in 0..4 {
        let request = traced(
            support::add("live", &format!("p{i}"), b""),
            &parent('1', 'a'),
        );
        client.add(request).await.unwrap();
    }
    let many = pb::AddManyRequest {
        items: vec![with_context(
            support::add("live", "p4", b""),
            parent('2', 'b'),
        )],
    };
    client.add_many(many).await.unwrap();
    let batch = next_batch(&mut batches).await;
    assert_eq!(batch.items.len(), 5);
    assert_eq!(batch.trace_context, "");
    // A process with tracing on exports what it holds before it exits.
    process.stop().await;
    assert!(receiver.spans().is_empty(), "{:?}", receiver.spans());
}
