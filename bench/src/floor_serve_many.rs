//! The FROZEN ADDMANY SERVICE FLOOR: the least a gRPC service on batcher's
//! stack (tokio, tonic, prost, redis-rs) does per AddMany, in front of a
//! frozen floor script. DO NOT CHANGE IT to follow the service; like
//! `floor_serve.rs` (row 2c, unary Add) it is a yardstick the service's own
//! code cannot move.
//!
//! `batcher-bench __floor_serve_many --redis-url URL` serves
//! `/batcher.v1.Batcher/AddMany` on a free loopback port (printing
//! `LISTENING <addr>`, as `__serve` does) with tonic's default server and
//! prost's codec, and nothing else: no layers, no validation, no metrics,
//! no shards, no merging of calls. Each request is one `EVALSHA` of the
//! floor script `bench/floor/floor_counters.lua` (max_items 10, max_wait 1 h, a dedup window of 10
//! minutes, the service's default) on one multiplexed redis-rs
//! connection: every key of the request in one hash tag, each distinct
//! key's group once in KEYS, its items in order. Each item's reply is
//! `DUPLICATE`, or `ADDED` with its group's size (0 when it completed the
//! group). Every other method is `UNIMPLEMENTED`. Row 1c of the bench
//! drives it with scenario 1's load, so that Redis's CPU per item under
//! that load can be read beside the least any service in front of Redis
//! makes it cost, on the same machine and Redis.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use batcher::pb;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The frozen floor script it serves: the floor of our layout, whose
/// instructions per item our add matches (`batcher-bench instructions`).
const SCRIPT: &str = include_str!("../floor/floor_counters.lua");
/// Its name, as the rows give it.
pub const SCRIPT_NAME: &str = "floor_counters";

/// The floor's whole state: the script and one multiplexed connection.
#[derive(Clone)]
struct FloorMany {
    script: Arc<redis::Script>,
    redis: redis::aio::MultiplexedConnection,
}

impl FloorMany {
    async fn add_many(&self, request: pb::AddManyRequest) -> Result<pb::AddManyResponse, Status> {
        let tag = "{floor}";
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(format!("{tag}:due"))
            .key(format!("{tag}:stream"))
            .key(format!("{tag}:flushed"))
            .arg(10)
            .arg(3_600_000)
            .arg(600_000);
        let mut groups: HashMap<&str, usize> = HashMap::new();
        for add in &request.items {
            let next = groups.len() + 1;
            let group = *groups.entry(add.key.as_str()).or_insert_with(|| {
                invocation.key(format!("{tag}:g:{}", add.key));
                next
            });
            let item = add.item.as_ref();
            invocation
                .arg(group)
                .arg(item.map_or("", |i| i.id.as_str()))
                .arg(item.map_or(&[][..], |i| &i.payload[..]));
        }
        let reply: Vec<redis::Value> = invocation
            .invoke_async(&mut self.redis.clone())
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let results = reply
            .iter()
            .map(|r| {
                let (outcome, size) = match r {
                    redis::Value::Int(0) => (pb::AddOutcome::Duplicate, 0),
                    redis::Value::Int(n) => (pb::AddOutcome::Added, *n as u32),
                    _ => (pb::AddOutcome::Added, 0),
                };
                pb::AddResponse {
                    outcome: outcome as i32,
                    group_size: size,
                    ..Default::default()
                }
            })
            .collect();
        Ok(pb::AddManyResponse { results })
    }
}

impl UnaryService<pb::AddManyRequest> for FloorMany {
    type Response = pb::AddManyResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<pb::AddManyResponse>, Status>> + Send>>;

    fn call(&mut self, request: Request<pb::AddManyRequest>) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move {
            floor
                .add_many(request.into_inner())
                .await
                .map(Response::new)
        })
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for FloorMany {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move {
            if request.uri().path() != "/batcher.v1.Batcher/AddMany" {
                return Ok(Status::unimplemented("the floor serves AddMany only").into_http());
            }
            let mut grpc =
                Grpc::new(ProstCodec::<pb::AddManyResponse, pb::AddManyRequest>::default());
            Ok(grpc.unary(floor, request).await)
        })
    }
}

impl NamedService for FloorMany {
    const NAME: &'static str = "batcher.v1.Batcher";
}

/// Serves the floor script until killed; errors end it with a message.
pub async fn serve(redis_url: &str) -> Result<(), String> {
    let (redis, incoming) = crate::floor_serve::start(redis_url).await?;
    let script = Arc::new(redis::Script::new(SCRIPT));
    tonic::transport::Server::builder()
        .add_service(FloorMany { script, redis })
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| e.to_string())
}
