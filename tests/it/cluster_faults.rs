//! The service over a real Redis Cluster whose topology changes under load:
//! a master killed with SIGKILL and failed over to its replica, a slot
//! migrated live to another master, and what `wait_replicas` buys across a
//! master crash. Each test starts its own cluster of 3 masters and 3
//! replicas; they run one at a time, so failovers are not slowed by each
//! other on a small machine.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::cluster::{self, Cluster, ClusterNode, node_id, wait_all_flushed};
use crate::support::load::{Load, Placement, Tally, placement};
use crate::support::{DEADLINE, Service, all_batches, eventually, store, wait_health};
use batcher::config::{AppendFsync, Config};
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// One fault test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Groups of up to 20 items, flushed 300 ms after they open.
const POLICY: &str = "[defaults]\nmax_items = 20\nmax_wait = \"300ms\"\n\
                      [sweeper]\nmax_sleep = \"100ms\"\n";
/// Callers adding at once.
const CALLERS: usize = 4;
/// Keys the callers spread their adds over.
const KEYS: usize = 16;
/// Answered adds to wait for before and after each change.
const STEADY: usize = 150;
/// Calls to wait for at each step of a slot migration.
const MID_MIGRATION: usize = 8;

/// A service with `config`, with callers adding under load.
async fn load(config: &Config) -> (Service, Load) {
    let service = Service::start(config.clone()).await;
    let mut clients = Vec::new();
    for _ in 0..CALLERS {
        clients.push(service.client().await);
    }
    (service, Load::start(clients, KEYS))
}

/// Stops the load, lets every group flush, and counts the acknowledged items
/// against every batch in the streams.
async fn settle(service: Service, load: Load, config: &Config) -> (Tally, Placement) {
    let tally = load.finish().await;
    wait_all_flushed(&service.client().await).await;
    let batches = all_batches(&store(config)).await;
    service.stop().await;
    let placed = placement(&tally, &batches);
    (tally, placed)
}

/// The index of the node listening on `port`.
fn node_at(cluster: &Cluster, port: u16) -> usize {
    let nodes = cluster.nodes();
    nodes.iter().position(|n| n.port() == port).unwrap()
}

/// One round under load: kill -9 a master, wait for its replica to take
/// over, restart the killed node and wait until it is a replica again.
async fn failover_round(
    cluster: &mut Cluster,
    prefix: &str,
    wait_replicas: u32,
) -> (Tally, Placement) {
    let redis = format!("wait_replicas = {wait_replicas}\nwait_timeout = \"200ms\"\n");
    let config = cluster::config(&cluster.urls(), prefix, POLICY, &redis);
    let (service, load) = load(&config).await;
    load.wait_answered(STEADY).await;
    let victim = node_at(cluster, cluster.masters()[0].port().unwrap());
    let killed = Instant::now();
    cluster.nodes_mut()[victim].kill();
    cluster
        .wait_healthy(0, DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    let failover = killed.elapsed();
    // Every shard has a master again, so health is SERVING, node down or not.
    wait_health(service.addr, ServingStatus::Serving).await;
    eprintln!(
        "round {prefix}: killed {}, masters now {:?}",
        cluster.nodes()[victim].port(),
        cluster
            .masters()
            .iter()
            .map(|m| m.port())
            .collect::<Vec<_>>()
    );
    if wait_replicas == 0 {
        // With WAIT, the promoted master's shards wait for the restart: every
        // caller cycles through all keys, so all of them wait.
        load.wait_answered(STEADY).await;
    }
    cluster.nodes_mut()[victim].restart().unwrap();
    cluster
        .wait_healthy(1, DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    let rejoined = killed.elapsed();
    load.wait_answered(STEADY).await;
    let (tally, placed) = settle(service, load, &config).await;
    eprintln!(
        "failover round {prefix} (wait_replicas = {wait_replicas}): replica promoted after \
         {failover:?}, killed node a replica again after {rejoined:?}; {} UNAVAILABLE, \
         longest outage of a caller {:?}; {placed:?}",
        tally.unavailable, tally.longest_outage
    );
    (tally, placed)
}

/// Asserts callers saw only UNAVAILABLE, and none of them gave up.
#[track_caller]
fn assert_only_unavailable(tally: &Tally) {
    let other = &tally.other_errors;
    let first: Vec<_> = other.iter().take(3).collect();
    assert!(
        other.is_empty(),
        "{} other errors, first {first:?}",
        other.len()
    );
    assert_eq!(tally.gave_up, 0, "callers went unanswered too long");
}

/// A master killed with SIGKILL under load fails over to its replica; the
/// service keeps serving (failures in between are UNAVAILABLE, and every
/// caller is answered again within a bound), and with `wait_replicas = 1`
/// every acknowledged item is in exactly one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_failover_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut cluster = cluster::start(3, 1, None);
    let (tally, placed) = failover_round(&mut cluster, "failover", 1).await;
    assert_only_unavailable(&tally);
    assert!(placed.acknowledged >= 2 * STEADY, "{placed:?}");
    let clean = Placement {
        acknowledged: placed.acknowledged,
        ..Placement::default()
    };
    assert_eq!(placed, clean);
}

/// What `wait_replicas` buys, with `appendfsync always` on every node: a
/// master killed under load with 0 (counts printed) and with 1 (no
/// acknowledged item lost or doubled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_items_across_a_master_crash() {
    let _serial = SERIAL.lock().await;
    let mut cluster = cluster::start(3, 1, Some(AppendFsync::Always));
    let mut results = Vec::new();
    for wait_replicas in [0, 1] {
        let prefix = format!("durable-w{wait_replicas}");
        let (tally, placed) = failover_round(&mut cluster, &prefix, wait_replicas).await;
        assert_only_unavailable(&tally);
        results.push(placed);
    }
    for (wait_replicas, placed) in results.iter().enumerate() {
        eprintln!(
            "=== CLUSTER MASTER CRASH (appendfsync always, wait_replicas = {wait_replicas}): \
             {} acknowledged, {} lost, {} duplicated ===",
            placed.acknowledged, placed.lost, placed.duplicated
        );
    }
    // Both rounds ran under load through the crash; with 0 the losses are
    // only counted, since a write the replica never got may be lost.
    for placed in &results {
        assert!(placed.acknowledged >= 2 * STEADY, "{placed:?}");
    }
    let synced = &results[1];
    assert_eq!(
        (synced.lost, synced.duplicated, synced.unknown),
        (0, 0, 0),
        "{synced:?}"
    );
}

/// Which node serves `slot` as master, per `via`'s `CLUSTER NODES`.
fn owner(cluster: &Cluster, via: &ClusterNode, slot: u16) -> usize {
    let nodes: String = via.query(redis::cmd("CLUSTER").arg("NODES")).unwrap();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let serves = fields[8..].iter().any(|range| {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            match (from.parse::<u16>(), to.parse::<u16>()) {
                (Ok(from), Ok(to)) => (from..=to).contains(&slot),
                _ => false,
            }
        });
        if serves && fields[2].contains("master") {
            let port = fields[1].split(['@', ':']).nth(1).unwrap();
            return node_at(cluster, port.parse().unwrap());
        }
    }
    panic!("no master serves slot {slot}:\n{nodes}");
}

/// Moves `slot` from master `from` to master `to` the standard manual way:
/// IMPORTING / MIGRATING, MIGRATE of its keys one at a time, then SETSLOT
/// NODE on every master. The callers make calls while the slot is migrating
/// with none of its keys moved yet, and again with some moved.
async fn migrate_slot(cluster: &Cluster, load: &Load, slot: u16, from: usize, to: usize) -> usize {
    let (src, dst) = (&cluster.nodes()[from], &cluster.nodes()[to]);
    let (src_id, dst_id) = (node_id(src), node_id(dst));
    let setslot = |node: &ClusterNode, state: &str, id: &str| {
        let cmd = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .clone();
        node.query::<()>(&cmd)
            .unwrap_or_else(|e| panic!("SETSLOT {state}: {e}"));
    };
    setslot(dst, "IMPORTING", &src_id);
    setslot(src, "MIGRATING", &dst_id);
    load.wait_calls(MID_MIGRATION).await;
    let deadline = Instant::now() + DEADLINE;
    let mut moved = 0;
    loop {
        let keys: Vec<Vec<u8>> = src
            .query(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1))
            .unwrap();
        if keys.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "slot {slot} never drained");
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(dst.port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS");
        migrate.arg(&keys);
        src.query::<redis::Value>(&migrate)
            .unwrap_or_else(|e| panic!("MIGRATE: {e}"));
        moved += keys.len();
        if moved == 1 {
            load.wait_calls(MID_MIGRATION).await;
        }
    }
    setslot(dst, "NODE", &dst_id);
    setslot(src, "NODE", &dst_id);
    for master in cluster.masters() {
        let node = &cluster.nodes()[node_at(cluster, master.port().unwrap())];
        setslot(node, "NODE", &dst_id);
    }
    moved
}

/// Items a live subscriber of the resharding test has received so far.
static LIVE_ITEMS: AtomicUsize = AtomicUsize::new(0);

/// Receives a live subscription to every key until the service stops, and
/// counts how often each (key, item id) arrived.
async fn receive(mut client: BatcherClient<Channel>) -> HashMap<(String, String), usize> {
    let request = pb::SubscribeRequest::default();
    let mut stream = client.subscribe(request).await.unwrap().into_inner();
    let mut seen = HashMap::new();
    while let Ok(Some(batch)) = stream.message().await {
        for item in batch.items {
            *seen.entry((batch.key.clone(), item.id)).or_insert(0) += 1;
            LIVE_ITEMS.fetch_add(1, Ordering::SeqCst);
        }
    }
    seen
}

/// A slot migrated live to another master while callers add to it: callers
/// see only UNAVAILABLE, for no longer than the move, every acknowledged
/// item is in exactly one batch, and a live subscriber, whose shard tail
/// follows the slot, receives every batch once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_resharding_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster::start(3, 1, None);
    // One shard, so every add and every flush goes to the migrating slot.
    let config = cluster::config(&cluster.urls(), "reshard", POLICY, "shards = 1\n");
    let (service, load) = load(&config).await;
    // A live subscriber whose shard tail must follow the slot to its new node.
    let live = tokio::spawn(receive(service.client().await));
    load.wait_answered(STEADY).await;
    let node = &cluster.nodes()[0];
    let tag = Keyspace::new("reshard", 1).tag(0).to_owned();
    let slot: u16 = node
        .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(&tag))
        .unwrap();
    let from = owner(&cluster, node, slot);
    let masters = cluster.masters();
    let to_port = masters
        .iter()
        .filter_map(|m| m.port())
        .find(|p| *p != cluster.nodes()[from].port());
    let to = node_at(&cluster, to_port.unwrap());
    let started = Instant::now();
    let moved = migrate_slot(&cluster, &load, slot, from, to).await;
    let took = started.elapsed();
    cluster
        .wait_healthy(1, DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    eventually("every node to see the slot's new owner", || {
        let agreed = cluster
            .nodes()
            .iter()
            .all(|n| owner(&cluster, n, slot) == to);
        async move { agreed.then_some(()) }
    })
    .await;
    load.wait_answered(STEADY).await;
    let tally = load.finish().await;
    wait_all_flushed(&service.client().await).await;
    let batches = all_batches(&store(&config)).await;
    let items: usize = batches.iter().map(|b| b.items.len()).sum();
    eventually("the live subscriber to receive every item", || {
        let done = live.is_finished() || LIVE_ITEMS.load(Ordering::SeqCst) >= items;
        async move { done.then_some(()) }
    })
    .await;
    service.stop().await;
    let live = live.await.unwrap();
    assert_eq!(
        live,
        support::placements(&batches),
        "live subscriber vs streams"
    );
    let placed = placement(&tally, &batches);
    eprintln!(
        "resharding: moved {moved} keys of slot {slot} in {took:?}; {} UNAVAILABLE, \
         longest outage of a caller {:?}; {placed:?}",
        tally.unavailable, tally.longest_outage
    );
    assert_only_unavailable(&tally);
    // Adds that open a group fail TRYAGAIN while the slot is migrating (some
    // of their keys are missing), so callers may wait for the whole move.
    let bound = took + Duration::from_secs(5);
    assert!(tally.longest_outage < bound, "{:?}", tally.longest_outage);
    let clean = Placement {
        acknowledged: placed.acknowledged,
        ..Placement::default()
    };
    assert_eq!(placed, clean);
}
