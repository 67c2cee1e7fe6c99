//! Real `redis-server` processes for integration tests: the testkit's
//! (`batcher_testkit::redis`), each on its own free port in its own
//! temporary directory, killed when dropped. A Redis Cluster is in
//! `support::cluster`.

pub use batcher_testkit::redis::{RedisServer, cli};
