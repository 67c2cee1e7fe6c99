//! The harness that batcher's integration tests (`tests/it`) and its bench
//! (`bench/`) share: the processes they start, the clients they open and the
//! waits they make. Every `redis-server` here is started by the service's
//! own launcher (`batcher::embedded::launcher`), so tests, bench and
//! embedded mode start Redis one way.
//!
//! # Layout
//! - `wait`: waiting for an event with a deadline: [`eventually`] (tests,
//!   panics at [`DEADLINE`]) and [`Wait`] (own deadline and pauses, errors
//!   instead of panics).
//! - `ports`: free loopback ports that stay held: [`HeldPort`] and
//!   [`listener`].
//! - `process`: child processes: [`ChildGuard`] (killed on drop),
//!   [`die_with_parent`], and [`Spawn`], the one launcher of a service as a
//!   child process, which waits for the address it reports.
//! - `grpc`: clients of the Batcher service: [`connect`] (one try),
//!   [`client`] (until it answers) and [`channel`] (lazy).
//! - `redis`: [`RedisServer`], one real `redis-server` per test, killed on
//!   drop, restartable on its port, and [`cli`] (`redis-cli`).
//! - `cluster`: a local Redis Cluster ([`cluster::Cluster`], its nodes
//!   started by the launcher): one per test ([`cluster::start`]) or
//!   one shared by a whole test binary ([`cluster::shared`]).
#![warn(missing_docs)]

pub mod cluster;
pub mod grpc;
pub mod ports;
pub mod process;
pub mod redis;
pub mod wait;

pub use self::grpc::{Client, channel, client, connect};
pub use self::ports::{HeldPort, listener};
pub use self::process::{AddrLine, ChildGuard, Process, Spawn, die_with_parent};
pub use self::redis::{RedisServer, RedisServerBuilder, cli};
pub use self::wait::{DEADLINE, TimedOut, Wait, eventually};
