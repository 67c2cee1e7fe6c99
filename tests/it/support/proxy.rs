//! A fault proxy: a TCP proxy on a free loopback port that forwards to one
//! upstream (a redis-server) and, on the test's word, passes traffic,
//! stalls it, slows it or drops it, for every connection at once.
//!
//! Each connection is two directions, and each direction a reader and a
//! writer joined by a short queue of chunks stamped with the time they were
//! read. The reader stops reading while the link is stalled, so the sender's
//! buffers fill as over a cut link; the writer holds its chunks while
//! stalled and delivers each at its stamp plus the latency in force, so
//! latency does not add up behind a busy connection. What a stall held is
//! delivered when it ends, as TCP would after a short partition.
//!
//! Its tasks run on the test's runtime and end when the [`Proxy`] is dropped.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards every byte as it comes.
    Pass,
    /// Nothing moves either way; connections stay open and new ones are
    /// accepted, but not connected upstream until the stall ends.
    Stall,
    /// Every chunk is delivered this long after it was read, each way.
    Slow(Duration),
    /// Every connection is closed, and each new one at once.
    Drop,
}

/// Chunks one direction holds between its reader and its writer.
const QUEUED_CHUNKS: usize = 64;
/// The most bytes one read takes.
const CHUNK: usize = 16 * 1024;

/// A running fault proxy; see the module docs.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    fault: watch::Sender<Fault>,
}

impl Proxy {
    /// Starts a proxy to `upstream`, passing traffic.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("local addr");
        let (fault, watching) = watch::channel(Fault::Pass);
        tokio::spawn(accept(listener, upstream, watching));
        Proxy { addr, fault }
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Applies `fault` to every connection from now on.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

/// Accepts connections until the proxy is dropped.
async fn accept(listener: TcpListener, upstream: SocketAddr, mut fault: watch::Receiver<Fault>) {
    loop {
        let client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
            changed = fault.changed() => match changed {
                Ok(()) => continue,
                Err(_) => return,
            },
        };
        if *fault.borrow() == Fault::Drop {
            drop(client);
            continue;
        }
        tokio::spawn(forward(client, upstream, fault.clone()));
    }
}

/// Forwards one connection both ways until either side closes it or the
/// proxy drops it.
async fn forward(client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<Fault>) {
    // A connection made during a stall reaches Redis only when it ends.
    if !flowing(&mut fault).await {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        direction(client_read, server_write, fault.clone()),
        direction(server_read, client_write, fault),
    );
}

/// One direction of a connection: a reader and a writer over a queue.
async fn direction(from: OwnedReadHalf, to: OwnedWriteHalf, fault: watch::Receiver<Fault>) {
    let (chunks, queued) = mpsc::channel(QUEUED_CHUNKS);
    tokio::join!(read(from, chunks, fault.clone()), write(queued, to, fault));
}

/// Waits while the link is stalled; false once it is dropped (or the proxy is).
async fn flowing(fault: &mut watch::Receiver<Fault>) -> bool {
    match fault.wait_for(|f| *f != Fault::Stall).await {
        Ok(now) => *now != Fault::Drop,
        Err(_) => false,
    }
}

/// Reads chunks and stamps them, except while stalled; ends at end of
/// stream, on an error, or when the link is dropped.
async fn read(
    mut from: OwnedReadHalf,
    chunks: mpsc::Sender<(Instant, Vec<u8>)>,
    mut fault: watch::Receiver<Fault>,
) {
    loop {
        if !flowing(&mut fault).await {
            return;
        }
        let mut buf = vec![0; CHUNK];
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Look at the fault again (reading is cancel safe).
            _ = fault.changed() => continue,
        };
        buf.truncate(n);
        if chunks.send((Instant::now(), buf)).await.is_err() {
            return;
        }
    }
}

/// Writes each chunk when it is due; ends when the reader has ended and
/// every chunk is written (closing this direction), on an error, or at once
/// when the link is dropped.
async fn write(
    mut queued: mpsc::Receiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
) {
    loop {
        let next = tokio::select! {
            next = queued.recv() => next,
            changed = fault.changed() => match changed {
                Ok(()) if *fault.borrow() != Fault::Drop => continue,
                _ => return,
            },
        };
        let Some((read_at, chunk)) = next else {
            return;
        };
        if !due(read_at, &mut fault).await {
            return;
        }
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// Waits until a chunk read at `read_at` may go: at once when passing, at
/// `read_at` plus the latency when slow, never while stalled. False when the
/// link is dropped.
async fn due(read_at: Instant, fault: &mut watch::Receiver<Fault>) -> bool {
    loop {
        let now = *fault.borrow_and_update();
        let at = match now {
            Fault::Pass => return true,
            Fault::Drop => return false,
            Fault::Slow(latency) => Some(read_at + latency),
            Fault::Stall => None,
        };
        tokio::select! {
            changed = fault.changed() => if changed.is_err() { return false },
            _ = tokio::time::sleep_until(at.unwrap_or(read_at)), if at.is_some() => return true,
        }
    }
}
