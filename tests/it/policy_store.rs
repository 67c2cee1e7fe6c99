//! Policies as shared live data ([policy_store]): a change made through one
//! instance is in force on every instance within the bound, on one Redis and
//! on a cluster; etags refuse stale changes; bad policies are refused whole;
//! the history says who changed what and why; the file seeds an empty store
//! once (roles and key scopes: policy_roles.rs; open groups and other keys
//! under a change: policy_follow.rs).

use std::time::{Duration, Instant};

use batcher::config::Config;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::cluster::{self, shared};
use crate::support::load::until_answered;
use crate::support::{RedisServer, Service, add, assert_error_info, assert_invalid, eventually};

/// The store on, checked every 100 ms, with `policies` as the file's tables.
pub(crate) fn store_on(policies: &str) -> String {
    format!("{policies}\n[policy_store]\nenabled = true\ncheck_every = \"100ms\"\n")
}

pub(crate) type Client = BatcherClient<Channel>;

/// The policy named `name` (`defaults` or `keys/<pattern>`).
pub(crate) async fn get(client: &mut Client, name: &str) -> pb::Policy {
    let name = format!("policies/{name}");
    let req = pb::GetPolicyRequest { name };
    client.get_policy(req).await.unwrap().into_inner()
}

/// An update of `name`'s fields in `mask` to those of `policy`, with `etag`.
pub(crate) fn update(
    name: &str,
    policy: pb::Policy,
    mask: &[&str],
    etag: &str,
) -> pb::UpdatePolicyRequest {
    pb::UpdatePolicyRequest {
        policy: Some(pb::Policy {
            name: format!("policies/{name}"),
            etag: etag.to_owned(),
            ..policy
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: mask.iter().map(|p| (*p).to_owned()).collect(),
        }),
        reason: format!("test sets {}", mask.join(", ")),
    }
}

pub(crate) fn secs(s: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s as i64,
        nanos: 0,
    })
}

/// The max_items an instance applies to `key` now: GetGroup of an open
/// group shows the policy in force (an item is added if none is open).
pub(crate) async fn max_items_in_force(client: &mut Client, key: &str) -> u32 {
    let req = pb::GetGroupRequest { key: key.into() };
    let open = client.get_group(req.clone()).await.unwrap().into_inner();
    if let Some(group) = open.group {
        return group.max_items;
    }
    client.add(add(key, "probe", b"")).await.unwrap();
    let group = client.get_group(req).await.unwrap().into_inner().group;
    group.unwrap().max_items
}

/// Three instances with `config`: a change through the first is in force
/// on all three within 1 s, and a change with a stale etag is refused,
/// writing nothing.
async fn change_reaches_every_instance(config: Config) {
    let services = [
        Service::start(config.clone()).await,
        Service::start(config.clone()).await,
        Service::start(config).await,
    ];
    let mut clients = Vec::new();
    for s in &services {
        clients.push(s.client().await);
    }
    for client in &mut clients {
        // Each has loaded the store (seeded once from the file): 10.
        let ready = eventually("the store to load", || {
            let mut c = client.clone();
            async move { c.add(add("north", "probe", b"")).await.ok() }
        });
        ready.await;
        assert_eq!(max_items_in_force(client, "north").await, 10);
    }
    let read = get(&mut clients[0], "keys/north").await;
    let change = pb::Policy {
        max_items: Some(25),
        ..Default::default()
    };
    let req = update("keys/north", change, &["max_items"], &read.etag);
    let changed = clients[0].update_policy(req).await.unwrap().into_inner();
    assert_eq!(changed.max_items, Some(25));
    assert!(changed.revision > read.revision);
    let made = Instant::now();
    for client in &mut clients {
        while max_items_in_force(client, "north").await != 25 {
            assert!(
                made.elapsed() < Duration::from_secs(1),
                "not in force within 1 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // A change based on the first read is refused on any instance.
    let stale = update(
        "keys/north",
        pb::Policy::default(),
        &["max_wait"],
        &read.etag,
    );
    let status = clients[2].update_policy(stale).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_error_info(&status, "ETAG_MISMATCH");
    let now = get(&mut clients[1], "keys/north").await;
    assert_eq!((now.revision, now.max_items), (changed.revision, Some(25)));
    for s in services {
        s.stop().await;
    }
}

/// On one Redis, a change through one of three instances is in force on
/// all within 1 s, and a stale etag is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_reaches_three_instances_and_a_stale_etag_is_refused() {
    let redis = RedisServer::start();
    let text = store_on("[keys.\"north\"]\nmax_items = 10\n");
    change_reaches_every_instance(crate::support::config(&redis.url(), &text)).await;
}

/// On a Redis Cluster, the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_change_reaches_three_instances() {
    let text = store_on("[keys.\"north\"]\nmax_items = 10\n");
    let config = cluster::config(&shared().urls, "policy-store", &text, "");
    change_reaches_every_instance(config).await;
}

/// One instance over a fresh Redis with the store on.
pub(crate) async fn one(policies: &str) -> (RedisServer, Service, Client) {
    let redis = RedisServer::start();
    let config = crate::support::config(&redis.url(), &store_on(policies));
    let service = Service::start(config).await;
    let client = service.client().await;
    let ready = eventually("the store to load", || {
        let mut c = client.clone();
        async move {
            c.list_policies(pb::ListPoliciesRequest::default())
                .await
                .ok()
        }
    });
    ready.await;
    (redis, service, client)
}

/// A policy that breaks a rule the file's tables get is refused with
/// INVALID_ARGUMENT naming the field, and nothing is written.
#[tokio::test]
async fn a_bad_policy_is_refused_naming_the_field() {
    let (_redis, service, mut client) = one("").await;
    let before = client
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let held = pb::Policy {
        min_items: Some(5),
        ..Default::default()
    };
    let status = client
        .update_policy(update("keys/south-*", held, &[], ""))
        .await
        .unwrap_err();
    assert_invalid(&status, "policy.min_items");
    assert!(status.message().contains("needs max_age"), "{status:?}");
    let zero = pb::Policy {
        max_items: Some(0),
        ..Default::default()
    };
    let status = client
        .update_policy(update("keys/x", zero, &[], ""))
        .await
        .unwrap_err();
    assert_invalid(&status, "policy.max_items");
    let sometimes = pb::Policy {
        overflow: Some("sometimes".into()),
        ..Default::default()
    };
    let status = client
        .update_policy(update("keys/x", sometimes, &[], ""))
        .await
        .unwrap_err();
    assert_invalid(&status, "policy.overflow");
    assert!(status.message().contains("flush_oldest"), "{status:?}");
    let bad_name = update("areas/x", pb::Policy::default(), &[], "");
    let status = client.update_policy(bad_name).await.unwrap_err();
    assert_invalid(&status, "policy.name");
    let mask = update("keys/x", pb::Policy::default(), &["max_item"], "");
    assert_invalid(
        &client.update_policy(mask).await.unwrap_err(),
        "update_mask",
    );
    let after = client
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.revision, before.revision);
    assert_eq!(after.policies, before.policies);
    service.stop().await;
}

/// The history lists each revision newest first, with who made it, why,
/// and each field's old and new value; filtered by policy, it lists only
/// that policy's revisions.
#[tokio::test]
async fn the_history_says_who_changed_what_and_why() {
    let (_redis, service, mut client) = one("[keys.\"north\"]\nmax_items = 10\n").await;
    let change = pb::Policy {
        max_items: Some(40),
        max_wait: secs(7200),
        ..Default::default()
    };
    let req = update("keys/north", change, &["max_items", "max_wait"], "");
    client.update_policy(req).await.unwrap();
    let other = update("keys/south", pb::Policy::default(), &[], "");
    client.update_policy(other).await.unwrap();
    let req = pb::ListPolicyRevisionsRequest {
        name: "policies/keys/north".into(),
        ..Default::default()
    };
    let history = client
        .list_policy_revisions(req)
        .await
        .unwrap()
        .into_inner();
    let revs: Vec<u64> = history.revisions.iter().map(|r| r.revision).collect();
    assert_eq!(revs, [2, 1], "the seed and the change");
    let latest = &history.revisions[0];
    assert!(latest.who.starts_with("peer 127.0.0.1:"), "{latest:?}");
    assert_eq!(latest.reason, "test sets max_items, max_wait");
    let change = &latest.changes[0];
    assert_eq!(
        (change.name.as_str(), change.action.as_str()),
        ("policies/keys/north", "UPDATED")
    );
    let fields: Vec<_> = change
        .fields
        .iter()
        .map(|f| (f.field.as_str(), f.old_value.as_str(), f.new_value.as_str()))
        .collect();
    assert_eq!(
        fields,
        [("max_items", "10", "40"), ("max_wait", "null", "\"2h\"")]
    );
    let seed = &history.revisions[1];
    assert!(seed.who.starts_with("config file"), "{seed:?}");
    let all = pb::ListPolicyRevisionsRequest {
        page_size: 1,
        ..Default::default()
    };
    let page = client
        .list_policy_revisions(all)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.revisions[0].revision, 3);
    assert_eq!(page.next_page_token, "3");
    service.stop().await;
}

/// The file seeds an empty store once: a second instance whose file says
/// otherwise finds the store's policies in force, not its file's.
#[tokio::test]
async fn the_file_seeds_an_empty_store_once() {
    let redis = RedisServer::start();
    let first = crate::support::config(&redis.url(), &store_on("[defaults]\nmax_items = 7\n"));
    let a = Service::start(first).await;
    let mut ca = a.client().await;
    let seeded = eventually("the seed", || {
        let mut c = ca.clone();
        async move {
            c.get_policy(pb::GetPolicyRequest {
                name: "policies/defaults".into(),
            })
            .await
            .ok()
        }
    });
    assert_eq!(seeded.await.into_inner().max_items, Some(7));
    let second = crate::support::config(&redis.url(), &store_on("[defaults]\nmax_items = 99\n"));
    let b = Service::start(second).await;
    let mut cb = b.client().await;
    let in_force = eventually("the second instance to load", || {
        let mut c = cb.clone();
        async move {
            c.add(add("k", "x", b"")).await.ok()?;
            let req = pb::GetGroupRequest { key: "k".into() };
            Some(c.get_group(req).await.ok()?.into_inner().group?.max_items)
        }
    });
    assert_eq!(in_force.await, 7);
    assert_eq!(max_items_in_force(&mut ca, "k").await, 7);
    let history = cb
        .list_policy_revisions(pb::ListPolicyRevisionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(history.revisions.len(), 1, "seeded once");
    a.stop().await;
    b.stop().await;
}

/// With the store off, the policy methods fail FAILED_PRECONDITION.
#[tokio::test]
async fn with_the_store_off_the_policy_methods_say_so() {
    let redis = RedisServer::start();
    let service = Service::start(crate::support::config(&redis.url(), "")).await;
    let mut client = service.client().await;
    let status = client
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_error_info(&status, "POLICY_STORE_OFF");
    service.stop().await;
}

/// Until an instance has read the store, its adds are refused UNAVAILABLE
/// (reason POLICIES_NOT_LOADED), never judged by the file's policies.
#[tokio::test]
async fn adds_wait_for_the_store_to_be_read() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    let config = crate::support::config(&url, &store_on(""));
    let service = Service::start(config).await;
    let mut client = service.client().await;
    let status = client.add(add("k", "a", b"")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_error_info(&status, "POLICIES_NOT_LOADED");
    service.stop().await;
}

/// An import of more than 1000 policies (staged, then swapped in) is one
/// revision that the history counts, in force on another instance, and
/// changes after it replay as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_import_is_one_revision_on_every_instance() {
    let redis = RedisServer::start();
    let config = crate::support::config(&redis.url(), &store_on(""));
    let (a, b) = (
        Service::start(config.clone()).await,
        Service::start(config).await,
    );
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let policies = (0..1500)
        .map(|i| pb::Policy {
            name: format!("policies/keys/area-{i:04}"),
            max_items: Some(2 + i % 50),
            ..Default::default()
        })
        .collect();
    let req = pb::ImportPoliciesRequest {
        policies,
        reason: "postcodes".into(),
        ..Default::default()
    };
    // UNAVAILABLE until the store has loaded; any other error fails.
    let import = until_answered("the import", || {
        let (mut c, req) = (ca.clone(), req.clone());
        async move { c.import_policies(req).await }
    });
    let (done, _) = import.await;
    assert_eq!(done.created, 1500);
    let in_force = eventually("the import on the other instance", || {
        let mut c = cb.clone();
        async move {
            let n = max_items_in_force(&mut c, "area-1499").await;
            (n == 2 + 1499 % 50).then_some(n)
        }
    });
    in_force.await;
    let revisions = cb
        .list_policy_revisions(pb::ListPolicyRevisionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .revisions;
    assert_eq!(revisions[0].revision, done.revision);
    assert_eq!(revisions[0].bulk_count, 1500);
    assert_eq!(revisions[0].reason, "postcodes");
    let change = pb::Policy {
        max_items: Some(7),
        ..Default::default()
    };
    let req = update("keys/area-0003", change, &["max_items"], "");
    ca.update_policy(req).await.unwrap();
    let replayed = eventually("the change on the other instance", || {
        let mut c = cb.clone();
        async move { (max_items_in_force(&mut c, "area-0003").await == 7).then_some(()) }
    });
    replayed.await;
    let kept = get(&mut cb, "keys/area-0004").await;
    assert_eq!((kept.max_items, kept.revision), (Some(6), done.revision));
    a.stop().await;
    b.stop().await;
}
