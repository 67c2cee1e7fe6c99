//! The service over a real Redis Cluster of 3 masters and 3 replicas: the
//! API, live and durable subscriptions, exactly-once under concurrent
//! instances, and the layout check on every master. One cluster serves every
//! test of this binary; each test has its own key prefix, so tests never see
//! each other's data. Tests that change the topology are in cluster_faults.rs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::support::cluster::{self, shared, wait_all_flushed};
use crate::support::layout::{LAYOUT_CONFIG, Monitor, check_layout, exercise};
use crate::support::load::until_answered;
use crate::support::redis::cli;
use crate::support::{Service, add, all_batches, next_batch, placements, store};
use batcher::config::Config;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

/// A Redis reply these tests wait for: the shared cluster's six nodes
/// answer every cluster test at once, and on a busy machine a reply can
/// take longer than the default deadline, which these tests do not test.
const PATIENT: &str = "response_timeout = \"10s\"";

/// A service over the shared cluster with key prefix `prefix`.
async fn service(prefix: &str, extra: &str) -> (Config, Service, BatcherClient<Channel>) {
    let config = cluster::config(&shared().urls, prefix, extra, PATIENT);
    let service = Service::start(config.clone()).await;
    let client = service.client().await;
    (config, service, client)
}

/// A live subscription to every key of the service.
async fn live(client: &mut BatcherClient<Channel>) -> tonic::Streaming<pb::Batch> {
    let request = pb::SubscribeRequest::default();
    client.subscribe(request).await.unwrap().into_inner()
}

/// The ids of a batch's items, as strings.
fn ids(batch: &pb::Batch) -> Vec<String> {
    let id = |i: &pb::Item| i.id.clone();
    batch.items.iter().map(id).collect()
}

/// On a cluster, a group flushes by size in the completing add, by timeout,
/// and by hand; Remove and GetGroup see the open group.
#[tokio::test]
async fn flushes_remove_and_get_group_on_a_cluster() {
    // Only the key "timeout" falls due soon: the manual group must stay
    // open through add, remove, get and flush, however slow the machine.
    let extra = "[defaults]\nmax_items = 3\nmax_wait = \"10m\"\n\
                 [keys.\"timeout\"]\nmax_wait = \"300ms\"\n";
    let (_config, service, mut client) = service("api", extra).await;
    let mut batches = live(&mut client).await;
    for id in ["1", "2"] {
        let resp = client.add(add("size", id, b"p")).await.unwrap();
        assert!(resp.into_inner().flushed.is_none());
    }
    let resp = client.add(add("size", "3", b"p")).await.unwrap();
    let batch = resp.into_inner().flushed.expect("the third add flushes");
    assert_eq!(batch.reason, pb::FlushReason::Size as i32);
    assert_eq!(ids(&batch), ["1", "2", "3"]);

    client.add(add("manual", "x", b"")).await.unwrap();
    client.add(add("manual", "y", b"")).await.unwrap();
    let remove = pb::RemoveRequest {
        key: "manual".into(),
        item_id: "y".into(),
    };
    let removed = client.remove(remove).await.unwrap().into_inner();
    assert!(removed.removed && removed.group_size == 1, "{removed:?}");
    let get = pb::GetGroupRequest {
        key: "manual".into(),
    };
    let group = client.get_group(get).await.unwrap().into_inner().group;
    assert_eq!(group.expect("an open group").size, 1);
    let flush = pb::FlushRequest {
        key: "manual".into(),
    };
    let flushed = client.flush(flush).await.unwrap().into_inner();
    let manual = flushed.batch.expect("a batch");
    assert_eq!(manual.reason, pb::FlushReason::Manual as i32);
    assert_eq!(ids(&manual), ["x"]);

    client.add(add("timeout", "t", b"")).await.unwrap();
    let mut seen = HashMap::new();
    while seen.len() < 3 {
        let batch = next_batch(&mut batches).await;
        seen.insert(batch.key.clone(), batch.reason);
    }
    let reason = seen.get("timeout").copied();
    assert_eq!(reason, Some(pb::FlushReason::Timeout as i32), "{seen:?}");
    service.stop().await;
}

/// AddMany over 40 keys (every shard, on every master) accepts every item;
/// ListGroups pages through the groups of every shard; flushing them all
/// yields every item once, to a live subscriber too.
#[tokio::test]
async fn add_many_and_list_groups_span_every_shard() {
    let extra = "[defaults]\nmax_items = 1000\nmax_wait = \"10m\"\n";
    let (config, service, mut client) = service("shards", extra).await;
    let mut batches = live(&mut client).await;
    let keys: Vec<String> = (0..40).map(|k| format!("area-{k}")).collect();
    let items = (0..5)
        .flat_map(|i| keys.iter().map(move |k| add(k, &format!("{k}/{i}"), b"x")))
        .collect();
    let results = client.add_many(pb::AddManyRequest { items }).await.unwrap();
    let results = results.into_inner().results;
    assert_eq!(results.len(), 200);
    let added = pb::AddOutcome::Added as i32;
    assert!(results.iter().all(|r| r.outcome == added), "{results:?}");
    // The shards' keys live on every master.
    for port in &shared().masters {
        let tag = "{shards:*";
        let found = cli(*port, &["--scan", "--pattern", tag]);
        assert!(!found.is_empty(), "no shard of the test on master {port}");
    }
    let mut listed = HashSet::new();
    let mut token = String::new();
    loop {
        let request = pb::ListGroupsRequest {
            page_size: 7,
            page_token: token,
            key_prefix: String::new(),
        };
        let page = client.list_groups(request).await.unwrap().into_inner();
        for group in page.groups {
            assert_eq!(group.size, 5, "{group:?}");
            assert!(listed.insert(group.key.clone()), "{} twice", group.key);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, keys.iter().cloned().collect());
    for key in &keys {
        client
            .flush(pb::FlushRequest { key: key.clone() })
            .await
            .unwrap();
    }
    let mut received = 0;
    while received < 200 {
        received += next_batch(&mut batches).await.items.len();
    }
    let all = all_batches(&store(&config)).await;
    assert_eq!(placements(&all).len(), 200);
    assert!(placements(&all).values().all(|n| *n == 1));
    service.stop().await;
}

/// A durable subscription on a cluster delivers the batches of every shard;
/// acked batches never come back, unacked ones are redelivered with the same
/// ids after the ack timeout. The ack timeout (2 s) is long enough that no
/// redelivery comes before the first deliveries are read and acked.
#[tokio::test]
async fn durable_subscription_acks_and_redelivers_on_a_cluster() {
    let extra = "[defaults]\nmax_items = 1\nmax_wait = \"10m\"\n\
                 [subscriptions]\nack_timeout = \"2s\"\nmax_deliveries = 100\n";
    let (_config, service, mut client) = service("durable", extra).await;
    let request = pb::SubscribeRequest {
        consumer_group: "trucks".into(),
        consumer: "c1".into(),
        ..Default::default()
    };
    let mut stream = client.subscribe(request).await.unwrap().into_inner();
    let mut flushed = HashSet::new();
    for k in 0..16 {
        let resp = client.add(add(&format!("k{k}"), "x", b"")).await.unwrap();
        flushed.insert(resp.into_inner().flushed.expect("max_items 1").id);
    }
    let mut first = HashSet::new();
    while first.len() < flushed.len() {
        let batch = next_batch(&mut stream).await;
        assert_eq!(batch.delivery_count, 1, "{batch:?}");
        first.insert(batch.id);
    }
    assert_eq!(first, flushed);
    let flushed: Vec<String> = flushed.into_iter().collect();
    let (acked, unacked) = flushed.split_at(flushed.len() / 2);
    let (acked, unacked) = (acked.to_vec(), unacked.to_vec());
    let ack = pb::AckRequest {
        consumer_group: "trucks".into(),
        batch_ids: acked.clone(),
    };
    let count = client.ack(ack).await.unwrap().into_inner().acked;
    assert_eq!(count as usize, acked.len());
    let mut again = HashSet::new();
    while again.len() < unacked.len() {
        let batch = next_batch(&mut stream).await;
        assert!(unacked.contains(&batch.id), "{} came back", batch.id);
        assert!(batch.delivery_count >= 2, "{batch:?}");
        again.insert(batch.id);
    }
    let ack = pb::AckRequest {
        consumer_group: "trucks".into(),
        batch_ids: unacked,
    };
    client.ack(ack).await.unwrap();
    service.stop().await;
}

/// What the callers of the concurrency test were told.
#[derive(Default)]
struct Answers {
    /// How often each (key, id) was answered ADDED.
    accepted: HashMap<(String, String), usize>,
    /// Items whose add once failed UNAVAILABLE: Redis may have applied it.
    unanswered: HashSet<(String, String)>,
}

/// One caller: 100 adds of ids from a pool that other callers add too (as
/// retries would), spread over 12 keys; an UNAVAILABLE add is retried.
async fn caller(client: BatcherClient<Channel>, task: u64, answers: Arc<Mutex<Answers>>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(task);
    for _ in 0..100 {
        let key = format!("area-{}", rng.random_range(0..12));
        let id = format!("parcel-{}", rng.random_range(0..400));
        let item = (key.clone(), id.clone());
        let (resp, failed) = until_answered(&format!("{item:?}"), || {
            let mut client = client.clone();
            let req = add(&key, &id, b"x");
            async move { client.add(req).await }
        })
        .await;
        if failed {
            answers.lock().unwrap().unanswered.insert(item.clone());
        }
        if resp.outcome == pb::AddOutcome::Added as i32 {
            *answers.lock().unwrap().accepted.entry(item).or_insert(0) += 1;
        }
    }
}

/// Three instances over one cluster, twelve callers adding the same ids
/// concurrently while every instance sweeps: each id is accepted once and
/// every accepted item is in exactly one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_instances_add_exactly_once() {
    let extra = "[defaults]\nmax_items = 7\nmax_wait = \"200ms\"\n\
                 [sweeper]\nmax_sleep = \"50ms\"\n";
    let config = cluster::config(&shared().urls, "once", extra, "");
    let mut services = Vec::new();
    for _ in 0..3 {
        services.push(Service::start(config.clone()).await);
    }
    let answers: Arc<Mutex<Answers>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..12 {
        let client = services[task % 3].client().await;
        let answers = answers.clone();
        tasks.push(tokio::spawn(caller(client, task as u64, answers)));
    }
    for task in tasks {
        task.await.unwrap();
    }
    wait_all_flushed(&services[0].client().await).await;
    let batches = all_batches(&store(&config)).await;
    assert!(batches.iter().all(|b| (1..=7).contains(&b.items.len())));
    let placed = placements(&batches);
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    for (item, count) in &answers.accepted {
        assert_eq!(*count, 1, "{item:?} was accepted {count} times");
        assert_eq!(placed.get(item), Some(&1), "{item:?}");
    }
    for (item, count) in &placed {
        assert_eq!(*count, 1, "{item:?} is in {count} batches");
        let known = answers.accepted.contains_key(item) || answers.unanswered.contains(item);
        assert!(known, "a batch holds {item:?}, which was never accepted");
    }
    for service in services {
        service.stop().await;
    }
}

/// On every master of the cluster, every command the service sends while it
/// runs every flow keeps its keys (per `COMMAND GETKEYS`) under one hash tag.
/// The cluster is shared, so only the commands on this test's keys (prefix
/// `layout`) are checked and counted.
#[tokio::test]
async fn every_command_stays_in_one_slot_on_a_cluster() {
    let mut monitors = Vec::new();
    for port in &shared().masters {
        monitors.push((*port, Monitor::start(*port).await));
    }
    let (_config, service, mut client) = service("layout", LAYOUT_CONFIG).await;
    exercise(&mut client).await;
    service.stop().await;
    let mut keyed = 0;
    let mut names = HashSet::new();
    for (port, monitor) in monitors {
        let seen = monitor.finish().await;
        let ours: String = seen
            .lines()
            .filter(|line| line.contains("{layout"))
            .map(|line| format!("{line}\n"))
            .collect();
        let layout = check_layout(port, &ours);
        keyed += layout.keyed;
        names.extend(layout.names);
    }
    assert!(keyed > 10, "only {keyed} keyed commands");
    for name in ["EVALSHA", "XREADGROUP", "XADD"] {
        assert!(names.contains(name), "{name} not seen: {names:?}");
    }
}
