//! Scenario 14: what tracing costs the add path. Scenario 1's AddMany load
//! (100 items a call over 10k keys, 16 callers), with a W3C traceparent on
//! every item (`AddRequest.trace_context`, a fresh trace each), runs on a
//! fresh service over an emptied Redis with tracing off, then on, then on,
//! then off (quick: off, on). On, the service exports over OTLP/gRPC to a
//! receiver in the bench's process that counts the spans and drops them.
//! Figures: the service's and Redis's CPU µs per added item, pooled over
//! each setting's runs; the ratio on/off of the service's is the row.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use batcher::pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use super::ingest::{Ingest, add_many_load};
use super::load::{Rng, add_request};
use super::procs::{RedisServer, ServiceProc};
use super::report::{Results, Row, Verdict};
use super::scenarios::{Sizes, Target};
use super::service::{Env, wait_ready};

/// The runs, in order: false = tracing off.
const ORDER: [bool; 4] = [false, true, true, false];

/// What scenario 14 measured.
pub struct TracingCost {
    pub off: Vec<Ingest>,
    pub on: Vec<Ingest>,
    /// Spans the receiver took.
    pub spans: u64,
}

/// An OTLP trace receiver that counts spans.
struct Sink(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts the receiver on a free port.
async fn sink() -> Result<(SocketAddr, Arc<AtomicU64>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let spans = Arc::new(AtomicU64::default());
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Sink(spans.clone())))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    Ok((addr, spans))
}

/// An item with a traceparent of a fresh trace.
fn traced(rng: &mut Rng, key: String, id: String) -> pb::AddRequest {
    let trace = format!("{:016x}{:016x}", rng.below(u64::MAX), rng.below(u64::MAX));
    let span = format!("{:016x}", rng.below(u64::MAX) | 1);
    pb::AddRequest {
        trace_context: format!("00-{trace}-{span}-01"),
        ..add_request(key, id)
    }
}

/// Runs the scenario; needs the bench's own Redis and service.
pub async fn run(
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
    quick: bool,
) -> Result<TracingCost, String> {
    let (receiver, spans) = sink().await?;
    let order: &[bool] = if quick { &ORDER[..2] } else { &ORDER };
    let mut cost = TracingCost {
        off: Vec::new(),
        on: Vec::new(),
        spans: 0,
    };
    for (n, &on) in order.iter().enumerate() {
        env.empty().await?;
        let vars = match on {
            true => vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}")),
                ("OTEL_SERVICE_NAME", "batcher-bench".to_owned()),
            ],
            false => Vec::new(),
        };
        let service = ServiceProc::start_with_env(&env.config_text, &vars).await?;
        wait_ready(service.addr).await?;
        let target = Target {
            addr: service.addr,
            service_pid: Some(service.pid()),
            redis_pid: env.redis.as_ref().and_then(RedisServer::pid),
            redis_url: env.redis_url.clone(),
            masters: Vec::new(),
        };
        let tag = format!("{run}{n}");
        let ingest = add_many_load(&target, sizes, &tag, "tc", traced).await?;
        drop(service);
        match on {
            true => cost.on.push(ingest),
            false => cost.off.push(ingest),
        }
    }
    cost.spans = spans.load(Ordering::Relaxed);
    Ok(cost)
}

/// CPU µs per item of `process`, pooled over `runs`.
fn pooled(runs: &[Ingest], process: &str) -> Option<f64> {
    let secs: f64 = runs
        .iter()
        .map(|r| r.cpu.seconds(process))
        .sum::<Option<f64>>()?;
    let items: u64 = runs.iter().map(|r| r.stats.added).sum();
    (items > 0).then(|| secs * 1e6 / items as f64)
}

/// The scenario's row and note.
pub fn report(results: &mut Results, name: &str, c: &TracingCost) {
    let (Some(off), Some(on)) = (pooled(&c.off, "service"), pooled(&c.on, "service")) else {
        results.not_run(name, "no CPU figures (the service is not the bench's own)");
        return;
    };
    let redis = |runs: &[Ingest]| pooled(runs, "redis").map_or("?".into(), |v| format!("{v:.1}"));
    let rate = |runs: &[Ingest]| {
        runs.iter().map(|r| r.stats.per_sec()).sum::<f64>() / runs.len().max(1) as f64
    };
    results.rows.push(Row::new(
        name,
        format!(
            "service {on:.1} µs per item traced vs {off:.1} µs off (+{:.1} µs)",
            on - off
        ),
        "reference",
        format!("{:.2}", on / off),
        Verdict::Info,
    ));
    results.notes.push(format!(
        "14. Tracing: every item carries a traceparent; runs off, on{}. Off: {:.0} items/s, \
         Redis {} µs per item; on: {:.0} items/s, Redis {} µs per item (each item stores its \
         span context, 52 bytes). The receiver took {} spans.",
        if c.off.len() > 1 { ", on, off" } else { "" },
        rate(&c.off),
        redis(&c.off),
        rate(&c.on),
        redis(&c.on),
        c.spans,
    ));
}
