//! batcher groups items per key in Redis and flushes each group as one batch
//! when it reaches a limit (items, bytes, a capacity measure) or when the
//! earliest of its due-time rules comes (wait window, idle time, cutoff,
//! item deadline, maximum age).
//!
//! # Layout
//! - `config`: the TOML config file: its tables, defaults, validation and error messages.
//! - `policy`: flush policies, key globs, the reloadable table every task
//!   reads, and the cutoff clock (local departure times in a time zone).
//! - `keys`: Redis key names, shards and hash tags (spread over the cluster
//!   slots); the only place that formats them.
//! - `scripts`: the Lua: the library of Redis Functions that alone knows a
//!   group's layout (format 4), and the durable subscriptions' four scripts.
//! - `batch`: items, batches and groups, the domain types, and the table of flush reasons.
//! - `store`: every script call and every Redis read and write, on one Redis or
//!   a Redis Cluster (with `WAIT` for replicas when asked), including the
//!   subscribers' blocking stream reads on their dedicated connections; replies
//!   are decoded into our types by `FromRedisValue`; adds wait in bounded
//!   per-shard queues.
//! - `policy_store`: policies as shared live data: the store in Redis
//!   (documents with revisions and etags, and their audited history), this
//!   instance's copy that the add path resolves against, kept current by a
//!   revision check, and open groups brought under a shorter `max_wait`.
//! - `sweeper`: flushes groups whose due time has passed (the flush script
//!   holds a group below `min_items` instead).
//! - `subscribers`: live subscriptions (shard tails fanned out to subscribers)
//!   and durable ones (consumers of a consumer group, each holding at most
//!   `max_unacked` unacked batches).
//! - `sinks`: delivery by the service itself (`[[sinks]]`): signed webhooks,
//!   each sink a durable consumer group acked on the receiver's acceptance,
//!   in order per key, retried, dead-lettered.
//! - `error`: the API's errors and the one mapping of them to gRPC status
//!   codes with AIP-193 error details (used by `auth` and `service`).
//! - `service`: the gRPC API: handlers (Requeue in its own file), request
//!   checks, protobuf conversions and one deadline per call.
//! - `embedded`: runs and supervises a `redis-server` child when no URL is configured;
//!   its `launcher` starts every `redis-server` child and local clusters
//!   (embedded mode, bench, tests).
//! - `tls`: TLS on the gRPC port (mutual TLS as an option), certificates
//!   reloaded on SIGHUP.
//! - `auth`: bearer tokens with roles and key scopes, guarding the Batcher service.
//! - `metrics`: the Prometheus families, their recorder and recording
//!   helpers, and the gRPC call counter; `store` records flushes into it.
//! - `gauges`: the task that refreshes the gauges read from Redis (through
//!   `store`, so above it).
//! - `json`: the protobuf JSON mapping of the API's messages (CLI, web view).
//! - `http`: the HTTP listener: `GET /metrics`, the live web view at `/`
//!   (assets compiled in) and its JSON API (groups by page, batches as
//!   Server-Sent Events), served through the gRPC service and its token checks.
//! - `telemetry`: OpenTelemetry traces over OTLP, on with the `OTEL_*`
//!   environment: add spans from a `traceparent`, whose contexts items keep
//!   in their ext, and each batch's flush span linking to them.
//! - `drain`: what a stop goes through (readiness false, a delay, calls
//!   refused, streams ended, durable deliveries released), in order and
//!   timed, and the health watcher behind gRPC health and `GET /readyz`.
//! - `server`: wires it all together and serves until the drain is over.
//! - `cli`: the operator CLI (`batcher add`, `tail`, `list`, ...): a gRPC
//!   client of the service, printing tables or JSON lines.

pub mod auth;
pub mod batch;
pub mod cli;
pub mod config;
pub mod drain;
pub mod embedded;
pub mod error;
pub mod gauges;
pub mod http;
pub mod json;
pub mod keys;
pub mod metrics;
pub mod policy;
pub mod policy_store;
pub mod scripts;
pub mod server;
pub mod service;
pub mod sinks;
pub mod store;
pub mod subscribers;
pub mod sweeper;
pub mod telemetry;
pub mod tls;

/// Generated protobuf and gRPC types; they stop at the `service` layer.
pub mod pb {
    tonic::include_proto!("batcher.v1");

    /// Encoded descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("batcher_descriptor");
}
