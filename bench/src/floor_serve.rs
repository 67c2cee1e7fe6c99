//! The FROZEN SERVICE FLOOR: the least a gRPC service on batcher's stack
//! (tokio, tonic, prost, redis-rs) does per unary Add. DO NOT CHANGE IT to
//! follow the service; it is a yardstick the service's own code cannot move,
//! as `bench/floor/floor.lua` is for the Redis side.
//!
//! `batcher-bench __floor_serve --redis-url URL` serves `/batcher.v1.Batcher/Add`
//! on a free loopback port (printing `LISTENING <addr>`, as `__serve` does)
//! with tonic's default server and prost's codec, and nothing else: no
//! layers, no validation, no metrics (Nagle's algorithm off, see [`start`]).
//! Each call is one `EVALSHA` of `bench/floor/floor.lua` (max_items 10,
//! max_wait 60 s) on one multiplexed redis-rs connection, with the item's
//! key, id and payload, and replies `ADDED` or `DUPLICATE`. Every other
//! method is `UNIMPLEMENTED`. Row 2c of the bench drives it with scenario
//! 2's load, so the service's CPU per add can be read beside what the stack
//! alone costs on the same machine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use batcher::pb;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The frozen floor script, the same one `instructions` counts.
const FLOOR_LUA: &str = include_str!("../floor/floor.lua");

/// The floor's whole state: the script and one multiplexed connection.
#[derive(Clone)]
struct Floor {
    script: Arc<redis::Script>,
    redis: redis::aio::MultiplexedConnection,
}

impl Floor {
    async fn add(&self, request: pb::AddRequest) -> Result<pb::AddResponse, Status> {
        let item = request.item.unwrap_or_default();
        let tag = "{floor}";
        let reply: Vec<redis::Value> = self
            .script
            .key(format!("{tag}:due"))
            .key(format!("{tag}:stream"))
            .key(format!("{tag}:g:{}", request.key))
            .arg(10)
            .arg(60_000)
            .arg(1)
            .arg(&item.id)
            .arg(&item.payload[..])
            .invoke_async(&mut self.redis.clone())
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let duplicate = matches!(reply.first(), Some(redis::Value::Int(0)));
        let outcome = if duplicate {
            pb::AddOutcome::Duplicate
        } else {
            pb::AddOutcome::Added
        };
        Ok(pb::AddResponse {
            outcome: outcome as i32,
            ..Default::default()
        })
    }
}

impl UnaryService<pb::AddRequest> for Floor {
    type Response = pb::AddResponse;
    type Future = Pin<Box<dyn Future<Output = Result<Response<pb::AddResponse>, Status>> + Send>>;

    fn call(&mut self, request: Request<pb::AddRequest>) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move { floor.add(request.into_inner()).await.map(Response::new) })
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for Floor {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move {
            if request.uri().path() != "/batcher.v1.Batcher/Add" {
                return Ok(Status::unimplemented("the floor serves Add only").into_http());
            }
            let mut grpc = Grpc::new(ProstCodec::<pb::AddResponse, pb::AddRequest>::default());
            Ok(grpc.unary(floor, request).await)
        })
    }
}

impl NamedService for Floor {
    const NAME: &'static str = "batcher.v1.Batcher";
}

/// What a service floor starts from (this one and the AddMany one of
/// `floor_serve_many.rs`): one multiplexed connection to Redis, and a
/// loopback listener on a free port, whose address it prints as
/// `LISTENING <addr>`. Both sides have Nagle's algorithm off
/// (`TCP_NODELAY`), as any service must that answers small replies: with
/// it on, a reply written in parts waits for the peer's delayed ACK, and
/// the AddMany floor served scenario 1 at a third of its rate
/// (bench/sittings/history.md, "The service, against a frozen service floor").
pub(crate) async fn start(
    redis_url: &str,
) -> Result<(redis::aio::MultiplexedConnection, TcpIncoming), String> {
    let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let info = redis::IntoConnectionInfo::into_connection_info(redis_url)
        .map_err(|e| e.to_string())?
        .set_tcp_settings(tcp);
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let redis = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach Redis: {e}"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot listen: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("LISTENING {addr}");
    Ok((redis, TcpIncoming::from(listener).with_nodelay(Some(true))))
}

/// Serves the floor until killed; errors end it with a message.
pub async fn serve(redis_url: &str) -> Result<(), String> {
    let (redis, incoming) = start(redis_url).await?;
    let script = Arc::new(redis::Script::new(FLOOR_LUA));
    tonic::transport::Server::builder()
        .add_service(Floor { script, redis })
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| e.to_string())
}
