//! The integration tests, one binary: a module per area of the service, and
//! the harness in `support` (real redis-server processes on free ports, the
//! one shared Redis Cluster, the service in-process or as a child process),
//! most of it the `batcher-testkit` crate, which the bench uses too.
//!
//! One binary links the crate once, and lets every cluster test share one
//! Redis Cluster (each under its own key prefix). What is global to the
//! process is therefore shared by every test here: the `metrics` recorder
//! above all, so a test that counts metrics exactly runs the service as a
//! child process (`support::Process`) with a recorder of its own.

mod support;

mod add_paths;
mod api;
mod auth;
mod cli;
mod cli_policy;
mod cli_tail;
mod cluster;
mod cluster_faults;
mod cutoffs;
mod deadlines;
mod docs;
mod drain;
mod durable;
mod flush_cut;
mod format;
mod image;
mod kubernetes;
mod layout;
mod metrics;
mod node;
mod open_limits;
mod overload;
mod paging;
mod partition;
mod policies;
mod policy_follow;
mod policy_roles;
mod policy_scripts;
mod policy_store;
mod prefetch;
mod python;
mod redis_auth_tls;
mod requeue;
mod resilience;
mod rolling;
mod runbook;
mod sinks;
mod subscribe;
mod timing;
mod tls;
mod traces;
mod wait_replicas;
mod web;
mod web_policy;
mod wire;
