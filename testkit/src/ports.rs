//! Free loopback ports that stay held. A port found by binding port 0 and
//! closing the socket again can be taken by another bind (a client's
//! ephemeral port, another test's server) before its user binds it; so a
//! service gets the listener itself ([`listener`]), or a port held for it
//! ([`HeldPort`]). The one kind of port probed and released is a
//! `redis-server`'s, which the server must bind itself: the launcher starts
//! it again on another port when it finds its port taken.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// A listener on a free loopback port (`127.0.0.1:0`), for a service to
/// serve on: the port is the listener's from the start.
pub async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

/// A loopback port held for a service that restarts. It is bound with
/// SO_REUSEPORT, so the next holder can bind it while a service still
/// listens on it, and while none listens, no client's ephemeral port (nor a
/// client connecting to itself) can take it.
pub struct HeldPort {
    /// The bound socket, not yet listening.
    socket: TcpSocket,
    /// The address it holds.
    pub addr: SocketAddr,
}

impl HeldPort {
    /// Holds a free loopback port.
    pub fn new() -> HeldPort {
        HeldPort::at(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Holds `addr` too, beside its current holder.
    pub fn at(addr: SocketAddr) -> HeldPort {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_reuseport(true).expect("SO_REUSEPORT");
        socket.bind(addr).expect("bind a held port");
        let addr = socket.local_addr().expect("local addr");
        HeldPort { socket, addr }
    }

    /// Starts listening, for a service to serve on.
    pub fn listen(self) -> TcpListener {
        self.socket.listen(1024).expect("listen")
    }
}

impl Default for HeldPort {
    fn default() -> Self {
        HeldPort::new()
    }
}
