//! The Redis layout is cluster-ready: every command the service sends to a
//! single Redis (scripts, the commands they run, plain commands, pipelines)
//! keeps all of its keys under one hash tag, so in one Redis Cluster slot.
//! tests/cluster.rs runs the same check on every master of a real cluster.

use crate::support::layout::{LAYOUT_CONFIG, Monitor, check_layout, exercise};
use crate::support::{RedisServer, Service, config};

/// Records every command the service sends while it adds, flushes (by size,
/// bytes, hand and timeout), removes, reads groups, serves live and durable
/// subscribers, dead-letters, re-drives and acks, and checks that each
/// command's keys (per `COMMAND GETKEYS`), including keys with braces, share
/// one hash tag.
#[tokio::test]
async fn every_command_stays_in_one_slot() {
    let redis = RedisServer::start();
    let monitor = Monitor::start(redis.port()).await;
    let service = Service::start(config(&redis.url(), LAYOUT_CONFIG)).await;
    let mut client = service.client().await;
    exercise(&mut client).await;
    service.stop().await;
    let layout = check_layout(redis.port(), &monitor.finish().await);
    assert!(layout.keyed > 10, "only {layout:?} keyed commands");
    // The add, flush, due and remove functions were all exercised, beside
    // the durable subscriptions' scripts (EVAL and EVALSHA of one script
    // count once each at most).
    assert!(layout.scripts.len() >= 7, "{layout:?}");
    // Plain commands were checked too, not only scripts.
    assert!(layout.names.contains("XREADGROUP"), "{:?}", layout.names);
}
