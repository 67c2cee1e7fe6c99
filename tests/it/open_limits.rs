//! Limits on open groups (a policy's `max_groups`, `[limits]
//! max_open_groups`) against a real Redis: an add past a limit is refused
//! with nothing written, or makes room by flushing the least recently
//! added-to group (OVERFLOW); every way a group closes frees its place; and
//! concurrent adds at the limit never pass it, lose nothing and double
//! nothing.

use std::collections::HashSet;
use std::num::NonZeroU16;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use batcher::config::Config;
use batcher::pb;
use batcher::policy::per_shard;
use batcher::store::Store;
use pb::FlushReason;

use crate::support::browser::Browser;
use crate::support::policy::{Client, clock_past, group, ids, now_ms, reason, subscribe_all};
use crate::support::{
    RedisServer, Service, add, all_batches, assert_error_info, config, next_batch, placements,
    store,
};

/// Scanner keys refused past 3 open groups (2 items a batch); bin keys flush their oldest
/// past 3; tmp keys refused past 1 and flushed 3 s after they open (long
/// enough for the refusal to come first on a busy machine); other keys wait
/// 10 minutes, unlimited.
const LIMITS: &str = r#"
[defaults]
max_items = 100
max_wait = "10m"

[keys."scan-*"]
max_groups = 3
max_items = 2

[keys."bin-*"]
max_groups = 3
overflow = "flush_oldest"

[keys."tmp-*"]
max_groups = 1
max_wait = "3s"
"#;

/// A Redis and the service on it with `extra` config and `shards` shards.
async fn start(extra: &str, shards: u16) -> (RedisServer, Service, Client, Config) {
    let redis = RedisServer::start();
    let mut config = config(&redis.url(), extra);
    config.redis.shards = NonZeroU16::new(shards).expect("at least one shard");
    let service = Service::start(config.clone()).await;
    let client = service.client().await;
    (redis, service, client, config)
}

/// Adds item `id` under `key`; returns its response, or the error status.
async fn try_add(
    client: &mut Client,
    key: &str,
    id: &str,
) -> Result<pb::AddResponse, tonic::Status> {
    client
        .add(add(key, id, id.as_bytes()))
        .await
        .map(|r| r.into_inner())
}

/// Adds item `id` under `key`, which must be accepted; waits first for the
/// clock to move on a millisecond, so that arrivals are ordered in time.
async fn added(client: &mut Client, key: &str, id: &str) -> pb::AddResponse {
    clock_past(now_ms()).await;
    let resp = try_add(client, key, id).await.expect("add");
    assert_eq!(
        resp.outcome(),
        pb::AddOutcome::Added,
        "{key}/{id}: {resp:?}"
    );
    resp
}

/// Asserts that adding `id` under `key` is refused by `limit`.
async fn refused(client: &mut Client, key: &str, id: &str, limit: &str) {
    let status = try_add(client, key, id)
        .await
        .expect_err("the add is refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = assert_error_info(&status, "OPEN_GROUPS_LIMIT");
    assert_eq!(info.get("limit").map(String::as_str), Some(limit));
    assert!(status.message().contains(limit), "{status:?}");
}

/// The keys of `batches` with their item ids.
fn flushed(batches: &[pb::Batch]) -> Vec<(String, FlushReason, Vec<String>)> {
    batches
        .iter()
        .map(|b| (b.key.clone(), reason(b), ids(&b.items)))
        .collect()
}

/// One OVERFLOW batch of `key` holding `ids`, as [`flushed`] lists it.
fn overflowed(key: &str, ids: &[&str]) -> Vec<(String, FlushReason, Vec<String>)> {
    let ids = ids.iter().map(|id| id.to_string()).collect();
    vec![(key.to_owned(), FlushReason::Overflow, ids)]
}

/// A key table's max_groups refuses a new group past it (unary Add:
/// RESOURCE_EXHAUSTED naming the limit; AddMany: REFUSED per item) and
/// writes nothing, while its open groups and other keys still take items;
/// a SIZE flush, a Flush, a Remove of the last item and a timeout each
/// free a place.
#[tokio::test]
async fn a_policy_limit_refuses_a_new_group_and_each_close_frees_a_place() {
    let (_redis, _service, mut client, _config) = start(LIMITS, 1).await;
    let limit = "policies/keys/scan-*.max_groups";
    for key in ["scan-1", "scan-2", "scan-3"] {
        added(&mut client, key, &format!("{key}-a")).await;
    }
    refused(&mut client, "scan-4", "x", limit).await;
    assert!(
        group(&mut client, "scan-4").await.is_none(),
        "nothing written"
    );
    added(&mut client, "area-1", "a").await;

    // The item that completes an open group (SIZE) frees its place.
    let resp = added(&mut client, "scan-1", "scan-1-b").await;
    assert_eq!(flushed(&resp.batches)[0].1, FlushReason::Size);
    added(&mut client, "scan-4", "x").await;

    let many = pb::AddManyRequest {
        items: vec![add("scan-5", "y", b"y"), add("scan-2", "scan-2-b", b"b")],
    };
    let results = client
        .add_many(many)
        .await
        .expect("AddMany")
        .into_inner()
        .results;
    assert_eq!(results[0].outcome(), pb::AddOutcome::Refused, "{results:?}");
    assert_eq!(results[0].limit, limit);
    assert_eq!(results[1].outcome(), pb::AddOutcome::Added, "{results:?}");
    assert!(
        group(&mut client, "scan-5").await.is_none(),
        "nothing written"
    );
    added(&mut client, "scan-5", "y").await;
    refused(&mut client, "scan-6", "z", limit).await;

    // A Flush frees a place.
    client
        .flush(pb::FlushRequest {
            key: "scan-3".into(),
        })
        .await
        .expect("Flush");
    added(&mut client, "scan-6", "z").await;
    refused(&mut client, "scan-7", "w", limit).await;

    // Removing a group's last item frees its place.
    let req = pb::RemoveRequest {
        key: "scan-4".into(),
        item_id: "x".into(),
    };
    client.remove(req).await.expect("Remove");
    added(&mut client, "scan-7", "w").await;
    refused(&mut client, "scan-8", "v", limit).await;

    // A timeout flush frees a place too.
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "tmp-1", "t1").await;
    refused(&mut client, "tmp-2", "t2", "policies/keys/tmp-*.max_groups").await;
    let batch = next_batch(&mut stream).await;
    assert_eq!(
        (batch.key.as_str(), reason(&batch)),
        ("tmp-1", FlushReason::Timeout)
    );
    added(&mut client, "tmp-2", "t2").await;
}

/// With overflow = "flush_oldest", an add that would pass max_groups
/// flushes the least recently added-to group first (reason OVERFLOW, in the
/// add's batches and to subscribers), one per new group when an AddMany
/// opens several; every item ends in exactly one batch.
#[tokio::test]
async fn flush_oldest_makes_room_with_the_least_recently_added_to_group() {
    let (_redis, _service, mut client, config) = start(LIMITS, 1).await;
    let mut stream = subscribe_all(&mut client).await;
    added(&mut client, "bin-1", "a").await;
    added(&mut client, "bin-2", "b").await;
    added(&mut client, "bin-3", "c").await;
    added(&mut client, "bin-1", "d").await;

    let resp = added(&mut client, "bin-4", "e").await;
    assert_eq!(flushed(&resp.batches), overflowed("bin-2", &["b"]));
    assert_eq!(resp.group_size, 1);
    assert!(group(&mut client, "bin-2").await.is_none());
    let delivered = next_batch(&mut stream).await;
    assert_eq!(
        (delivered.key.as_str(), reason(&delivered)),
        ("bin-2", FlushReason::Overflow)
    );

    clock_past(now_ms()).await;
    let many = pb::AddManyRequest {
        items: ["bin-5", "bin-6", "bin-7"]
            .iter()
            .map(|k| add(k, &format!("{k}-x"), b"x"))
            .collect(),
    };
    let results = client
        .add_many(many)
        .await
        .expect("AddMany")
        .into_inner()
        .results;
    let made_room: Vec<_> = results
        .iter()
        .map(|r| {
            assert_eq!(r.outcome(), pb::AddOutcome::Added, "{r:?}");
            flushed(&r.batches)
        })
        .collect();
    assert_eq!(
        made_room,
        [
            overflowed("bin-3", &["c"]),
            overflowed("bin-1", &["a", "d"]),
            overflowed("bin-4", &["e"]),
        ]
    );
    for key in ["bin-5", "bin-6", "bin-7"] {
        client
            .flush(pb::FlushRequest { key: key.into() })
            .await
            .expect("Flush");
    }
    let batches = all_batches(&store(&config)).await;
    let places = placements(&batches);
    assert_eq!(places.len(), 8, "{places:?}");
    assert!(places.values().all(|n| *n == 1), "{places:?}");
}

/// `[limits] max_open_groups` counts the groups of every key, and each
/// key's policy chooses: refuse (the defaults here) or flush the oldest
/// group of any key; the gauges' reading shows the groups against it.
#[tokio::test]
async fn the_service_limit_counts_every_key_and_the_policy_chooses_the_overflow() {
    let extra = "[limits]\nmax_open_groups = 2\n".to_owned()
        + "[keys.\"bin-*\"]\noverflow = \"flush_oldest\"\n";
    let (_redis, _service, mut client, config) = start(&extra, 1).await;
    added(&mut client, "area-1", "a").await;
    added(&mut client, "area-2", "b").await;
    refused(&mut client, "area-3", "c", "limits.max_open_groups").await;

    let resp = added(&mut client, "bin-1", "d").await;
    assert_eq!(flushed(&resp.batches), overflowed("area-1", &["a"]));

    let page = client
        .list_groups(pb::ListGroupsRequest::default())
        .await
        .expect("ListGroups")
        .into_inner();
    let limits: Vec<_> = page
        .open_group_limits
        .iter()
        .map(|l| (l.name.as_str(), l.open_groups, l.limit))
        .collect();
    assert_eq!(limits, [("limits.max_open_groups", 2, 2)]);
    let age = page.oldest_limited_group_age.expect("an oldest group");
    assert!((0..60).contains(&age.seconds), "{age:?}");

    // The gauges read the same from the store.
    let store = store(&config);
    store.set_max_open_groups(2);
    let read = store.open_limits().await.expect("limits");
    assert_eq!(read.rows, [("limits.max_open_groups".to_owned(), 2, 2)]);
}

/// Reads, until `done`, the most groups ever seen open under `scope`.
fn watch_most(
    store: Arc<Store>,
    scope: &'static str,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicU64>, Arc<AtomicBool>) {
    let most = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (seen, stop) = (most.clone(), done.clone());
    let watcher = tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let stats = store.open_limit_stats(&[scope]).await.expect("stats");
            seen.fetch_max(stats.per_scope[0], Ordering::Relaxed);
            tokio::task::yield_now().await;
        }
    });
    (watcher, most, done)
}

/// Many callers adding to more keys than a flush_oldest limit allows, on
/// four shards: the groups under the limit never pass it (each shard keeps
/// its part, ceil(8 / 4)), the index matches the groups really open, and
/// every accepted item is in exactly one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_at_the_limit_never_pass_it_and_lose_nothing() {
    let extra = "[defaults]\nmax_wait = \"10m\"\nmax_items = 5\n[keys.\"bin-*\"]\nmax_groups = 8\noverflow = \"flush_oldest\"\n";
    let (_redis, _service, client, config) = start(extra, 4).await;
    assert_eq!(per_shard(8, 4), 2);
    let store = Arc::new(store(&config));
    let (watcher, most, done) = watch_most(store.clone(), "kbin-*");
    let callers = (0..8).map(|caller| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for n in 0..60 {
                let key = format!("bin-{}", (caller * 7 + n * 13) % 40);
                let id = format!("{caller}-{n}");
                let resp = try_add(&mut client, &key, &id).await.expect("add");
                match resp.outcome() {
                    pb::AddOutcome::Added => accepted.push((key, id)),
                    pb::AddOutcome::Refused => {}
                    other => panic!("{key}/{id}: {other:?}"),
                }
            }
            accepted
        })
    });
    let mut accepted = HashSet::new();
    for caller in callers {
        accepted.extend(caller.await.expect("caller"));
    }
    done.store(true, Ordering::Relaxed);
    watcher.await.expect("watcher");
    assert!(
        most.load(Ordering::Relaxed) <= 8,
        "{} groups under the limit",
        most.load(Ordering::Relaxed)
    );
    assert!(
        accepted.len() > 400,
        "only {} of 480 adds accepted",
        accepted.len()
    );

    let mut open = 0;
    for n in 0..40 {
        let key = format!("bin-{n}");
        let mut client = client.clone();
        if group(&mut client, &key).await.is_some() {
            open += 1;
        }
    }
    let indexed = store.open_limit_stats(&["kbin-*"]).await.expect("stats");
    assert_eq!(
        indexed.per_scope[0], open,
        "the index holds exactly the open groups"
    );
    assert_eq!(indexed.groups, open);
    for n in 0..40 {
        let mut client = client.clone();
        client
            .flush(pb::FlushRequest {
                key: format!("bin-{n}"),
            })
            .await
            .expect("Flush");
    }
    let places = placements(&all_batches(&store).await);
    let placed: HashSet<(String, String)> = places.keys().cloned().collect();
    assert_eq!(
        placed, accepted,
        "every accepted item, and only those, is in a batch"
    );
    assert!(places.values().all(|n| *n == 1), "an item in two batches");
}

/// In headless Chromium the groups page shows each limit on open groups
/// with the groups open under it, as a meter that follows new groups, and
/// the oldest limited group's age.
#[tokio::test]
async fn the_page_shows_open_groups_against_each_limit() {
    let extra = "[limits]\nmax_open_groups = 8\n".to_owned() + LIMITS;
    let (_redis, service, mut client, _config) = start(&extra, 1).await;
    let http = service.http_addr.expect("an http listener");
    for key in ["scan-1", "scan-2", "area-1"] {
        added(&mut client, key, "p").await;
    }
    let mut browser = Browser::launch(1200, 800).await;
    browser.goto(&format!("http://{http}/")).await;
    let meter = |limit: &str| {
        format!("document.querySelector(\"#limits li[data-limit='{limit}'] [role=meter]\")")
    };
    let at = |limit: &str, open: u32, most: u32| {
        let m = meter(limit);
        format!(
            "{m}?.getAttribute('aria-valuenow') === '{open}' && {m}?.getAttribute('aria-valuemax') === '{most}'"
        )
    };
    browser
        .wait_for(
            "the service's limit at 3 of 8",
            &at("limits.max_open_groups", 3, 8),
        )
        .await;
    let scan = "policies/keys/scan-*.max_groups";
    browser.wait_for("scan-* at 2 of 3", &at(scan, 2, 3)).await;
    let oldest =
        "document.querySelector('#limits .oldest')?.textContent.startsWith('Oldest group')";
    browser.wait_for("the oldest group's age", oldest).await;

    added(&mut client, "scan-3", "p").await;
    browser.wait_for("scan-* at 3 of 3", &at(scan, 3, 3)).await;
    drop(browser);
    service.stop().await;
}
