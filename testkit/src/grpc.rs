//! Clients of the Batcher service over plaintext gRPC: one endpoint
//! setting for the tests and the bench, a single try ([`connect`]), a
//! client that waits until the service answers ([`client`]), and a lazy
//! channel ([`channel`]).

use std::net::SocketAddr;
use std::time::Duration;

use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::{Channel, Endpoint};

use crate::wait::eventually;

/// A gRPC client of the service. Each one made by [`connect`] or
/// [`client`] has its own HTTP/2 connection; clones share it.
pub type Client = BatcherClient<Channel>;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest reply a client decodes: a page of batches can be large.
const MAX_DECODING: usize = 64 << 20;

/// The endpoint of the service at `addr`: `http://ADDR`, no Nagle delay,
/// and a bounded connection attempt.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("an http URI")
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
}

/// Opens one HTTP/2 connection to the service at `addr`, once.
pub async fn connect(addr: SocketAddr) -> Result<Client, String> {
    let channel = endpoint(addr)
        .connect()
        .await
        .map_err(|e| format!("connect to the service at {addr}: {e}"))?;
    Ok(BatcherClient::new(channel).max_decoding_message_size(MAX_DECODING))
}

/// A client connected to `addr`, retrying until the server listens; panics
/// after the tests' deadline.
pub async fn client(addr: SocketAddr) -> Client {
    eventually("the service to accept connections", || async move {
        connect(addr).await.ok()
    })
    .await
}

/// A plaintext channel to `addr`; it connects on first use, so `addr` must
/// be bound already (a service's listener is bound before it starts).
pub fn channel(addr: SocketAddr) -> Channel {
    endpoint(addr).connect_lazy()
}
