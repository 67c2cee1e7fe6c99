//! Failures and concurrency against a real Redis: Redis going away, two
//! instances racing, a service SIGKILLed mid-load, config reloads, and the
//! embedded redis-server.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::cluster::wait_all_flushed;
use crate::support::load::{ItemRef, Load, Tally, until_answered};
use crate::support::{
    RedisServer, Service, add, all_batches, assert_error_info, config, eventually, next_batch,
    placements, store, wait_health,
};
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use rand::{Rng, SeedableRng};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// With Redis down calls fail fast with UNAVAILABLE and health reports
/// NOT_SERVING; when it returns the service works again by itself, health
/// reports SERVING, and the sweeper flushes what fell due.
#[tokio::test]
async fn redis_outage_is_unavailable_then_recovers() {
    let mut redis = RedisServer::start();
    let extra = r#"
[defaults]
max_items = 100
max_wait = "2s"
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    client.add(add("k", "before", b"")).await.unwrap();
    let group = client.get_group(pb::GetGroupRequest { key: "k".into() });
    let due = group
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap()
        .due_at
        .unwrap();
    redis.stop();

    let started = Instant::now();
    let status = client.add(add("k", "during", b"")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_error_info(&status, "REDIS_UNAVAILABLE");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let status = client
        .get_group(pb::GetGroupRequest { key: "k".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    wait_health(service.addr, ServingStatus::NotServing).await;

    // Let the group fall due while Redis is down (Redis's clock is this host's).
    eventually("the group to fall due", || {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let due = Duration::new(due.seconds as u64, due.nanos as u32);
        async move { (now > due).then_some(()) }
    })
    .await;
    redis.restart();
    let batch = eventually("the overdue group to be flushed", || {
        let store = store(&config(&redis.url(), extra));
        async move { all_batches(&store).await.into_iter().next() }
    })
    .await;
    assert_eq!(batch.items.len(), 1);
    assert_eq!(batch.items[0].id, b"before");
    eventually("adds to work again", || {
        let mut client = client.clone();
        async move { client.add(add("k2", "after", b"")).await.ok() }
    })
    .await;
    wait_health(service.addr, ServingStatus::Serving).await;
    service.stop().await;
}

/// What the callers of the two-instance test were told.
#[derive(Default)]
struct Answers {
    /// How often each item was answered ADDED.
    accepted: HashMap<ItemRef, usize>,
    /// Items whose add once failed with UNAVAILABLE (a Redis reply slower
    /// than the response timeout, under load): Redis may have applied it,
    /// and the retry that followed was then answered DUPLICATE.
    unanswered: HashSet<ItemRef>,
}

/// One caller of the two-instance test: 150 adds (every tenth an AddMany of
/// 5) of random ids that other callers add too, as retries would. A call
/// that fails with UNAVAILABLE is retried until answered. Checks every batch
/// it is handed.
async fn shared_id_caller(client: BatcherClient<Channel>, task: u64, answers: Arc<Mutex<Answers>>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(task);
    for i in 0..150 {
        let key = format!("area-{}", rng.random_range(0..6));
        let id = format!("parcel-{}", rng.random_range(0..600));
        let ids: Vec<String> = if i % 10 == 0 {
            (0..5).map(|j| format!("{id}-{j}")).collect()
        } else {
            vec![id]
        };
        let items: Vec<pb::AddRequest> = ids.iter().map(|id| add(&key, id, b"x")).collect();
        let (results, failed) = until_answered(&format!("add of {ids:?}"), || {
            let mut client = client.clone();
            let items = items.clone();
            async move {
                if items.len() > 1 {
                    let many = pb::AddManyRequest { items };
                    client.add_many(many).await.map(|r| r.map(|r| r.results))
                } else {
                    let one = client.add(items[0].clone()).await;
                    one.map(|r| r.map(|r| vec![r]))
                }
            }
        })
        .await;
        if failed {
            let mut answers = answers.lock().unwrap();
            let refs = ids.iter().map(|id| (key.clone(), id.clone()));
            answers.unanswered.extend(refs);
        }
        for (resp, id) in results.into_iter().zip(ids) {
            if resp.outcome == pb::AddOutcome::Added as i32 {
                let mut answers = answers.lock().unwrap();
                *answers.accepted.entry((key.clone(), id)).or_insert(0) += 1;
            }
            if let Some(batch) = resp.flushed {
                assert!(batch.items.len() <= 7);
            }
        }
    }
}

/// Many tasks add to the same keys through two instances sharing one Redis,
/// with retries, while both sweep: every accepted item lands in exactly one
/// batch and no batch exceeds max_items. The runtime has 4 worker threads,
/// so the callers and both instances really run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_through_two_instances() {
    let redis = RedisServer::start();
    let extra = r#"
[defaults]
max_items = 7
max_wait = "150ms"
[sweeper]
max_sleep = "50ms"
"#;
    let cfg = config(&redis.url(), extra);
    let a = Service::start(cfg.clone()).await;
    let b = Service::start(cfg.clone()).await;
    let answers: Arc<Mutex<Answers>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..16 {
        let client = if task % 2 == 0 {
            a.client().await
        } else {
            b.client().await
        };
        tasks.push(tokio::spawn(shared_id_caller(
            client,
            task,
            answers.clone(),
        )));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let client = a.client().await;
    wait_all_flushed(&client).await;
    let batches = all_batches(&store(&cfg)).await;
    assert!(
        batches
            .iter()
            .all(|batch| batch.items.len() <= 7 && !batch.items.is_empty())
    );
    let placed = placements(&batches);
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    // An item may be added again after its dedup window... which is 10 minutes here.
    for (item, count) in &answers.accepted {
        assert_eq!(*count, 1, "item {item:?} was accepted {count} times");
    }
    for item in answers.accepted.keys() {
        let count = placed.get(item);
        assert_eq!(count, Some(&1), "item {item:?} is in {count:?} batches");
    }
    for (item, count) in &placed {
        assert_eq!(*count, 1, "item {item:?} is in {count} batches");
        assert!(
            answers.accepted.contains_key(item) || answers.unanswered.contains(item),
            "a batch holds {item:?}, which was never accepted"
        );
    }
    assert!(
        batches
            .iter()
            .any(|b| b.reason == batcher::batch::FlushReason::Timeout)
    );
    assert!(
        batches
            .iter()
            .any(|b| b.reason == batcher::batch::FlushReason::Size)
    );
    a.stop().await;
    b.stop().await;
}

/// Checks that every (key, id) is in exactly one batch and no others are.
fn assert_exactly_once(
    batches: &[batcher::batch::Batch],
    items: impl IntoIterator<Item = ItemRef>,
) {
    let placed = placements(batches);
    let mut count = 0;
    for item in items {
        assert_eq!(placed.get(&item), Some(&1), "{item:?}");
        count += 1;
    }
    assert_eq!(
        placed.len(),
        count,
        "a batch holds an item that was never added"
    );
}

/// A service SIGKILLed mid-load loses nothing: after a restart, with the
/// unanswered adds retried, every accepted item is in exactly one batch and
/// the open groups still flush on time.
#[tokio::test]
async fn sigkill_mid_load_loses_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(
        &path,
        support::config_text(
            &redis.url(),
            "[defaults]\nmax_items = 9\nmax_wait = \"1s\"\n",
        ),
    )
    .unwrap();
    let mut first = support::serve(&path, dir.path()).start().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(support::client(first.addr).await);
    }
    // A killed server's clients see transport errors of several kinds.
    let load = Load::until_failure(clients, 5);
    load.wait_answered(400).await;
    first.kill();
    let Tally {
        acknowledged,
        unanswered: retries,
        ..
    } = load.finish().await;

    let second = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(second.addr).await;
    // The callers retry what got no answer: each lands at most once more.
    for (key, id) in &retries {
        client.add(add(key, id, b"payload")).await.unwrap();
    }
    wait_all_flushed(&client).await;
    let batches = all_batches(&store(&config(&redis.url(), ""))).await;
    assert_exactly_once(&batches, acknowledged.into_iter().chain(retries));
    assert!(batches.iter().all(|b| b.items.len() <= 9));
    // Groups left open by the crash still flushed on time: within the restart
    // time plus a little of their due time.
    for batch in batches
        .iter()
        .filter(|b| b.reason == batcher::batch::FlushReason::Timeout)
    {
        let late = batch.flushed_at_ms as i64 - (batch.opened_at_ms as i64 + 1000);
        assert!(
            (0..3000).contains(&late),
            "flushed {late} ms after its due time"
        );
    }
    drop(second);
}

/// Redis SIGKILLed mid-load and restarted from its AOF (appendfsync always):
/// every add that was answered ADDED, and every retried add, lands in exactly
/// one batch.
#[tokio::test]
async fn redis_crash_with_aof_always_loses_no_accepted_item() {
    let mut redis = RedisServer::builder().appendfsync("always").start();
    let extra = r#"
[defaults]
max_items = 6
max_wait = "500ms"
"#;
    let cfg = config(&redis.url(), extra);
    let service = Service::start(cfg.clone()).await;
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(service.client().await);
    }
    let load = Load::until_failure(clients, 4);
    load.wait_answered(300).await;
    redis.kill();
    let tally = load.finish().await;
    assert!(tally.other_errors.is_empty(), "{:?}", tally.other_errors);
    let retries = tally.unanswered;
    redis.restart();
    let client = service.client().await;
    for (key, id) in &retries {
        eventually("the retry to be answered", || {
            let mut client = client.clone();
            let req = add(key, id, b"payload");
            async move { client.add(req).await.ok() }
        })
        .await;
    }
    wait_all_flushed(&client).await;
    assert_exactly_once(
        &all_batches(&store(&cfg)).await,
        tally.acknowledged.into_iter().chain(retries),
    );
    service.stop().await;
}

/// SIGHUP reloads policies: max_items changes from the next add, max_wait for
/// groups opened afterwards, and a bad file is logged and ignored.
#[tokio::test]
async fn sighup_reloads_policies() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let write = |max_items: u32, max_wait: &str| {
        std::fs::write(
            &path,
            support::config_text(
                &redis.url(),
                &format!("[defaults]\nmax_items = {max_items}\nmax_wait = \"{max_wait}\"\n"),
            ),
        )
        .unwrap();
    };
    write(10, "10m");
    let process = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(process.addr).await;
    let mut batches = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    for id in ["a", "b", "c", "d"] {
        client.add(add("old", id, b"")).await.unwrap();
    }

    write(3, "300ms");
    process.signal(libc::SIGHUP);
    let probe = eventually("the reload to take effect", || {
        let mut client = client.clone();
        async move {
            let group = client
                .get_group(pb::GetGroupRequest { key: "old".into() })
                .await
                .unwrap()
                .into_inner()
                .group?;
            (group.max_items == 3).then_some(group)
        }
    })
    .await;
    assert_eq!(
        probe.max_wait.unwrap().seconds,
        600,
        "the open group keeps its wait window"
    );
    // The next add to the old group (now 5 items, max 3) cuts a batch of 3.
    let resp = client.add(add("old", "e", b"")).await.unwrap().into_inner();
    assert_eq!(resp.group_size, 2);
    let batch = next_batch(&mut batches).await;
    assert_eq!(batch.items.len(), 3);
    assert_eq!(batch.reason, pb::FlushReason::Size as i32);
    // A group opened now uses the new max_wait.
    client.add(add("new", "a", b"")).await.unwrap();
    let batch = next_batch(&mut batches).await;
    assert_eq!(batch.key, "new");
    assert_eq!(batch.reason, pb::FlushReason::Timeout as i32);

    std::fs::write(&path, "[defaults]\nmax_items = 0\n").unwrap();
    process.signal(libc::SIGHUP);
    eventually("the bad reload to be logged", || {
        let log = process.log();
        async move { log.contains("config reload failed").then_some(()) }
    })
    .await;
    assert!(
        process.log().contains("max_items"),
        "the log names the field"
    );
    let group = client
        .get_group(pb::GetGroupRequest { key: "old".into() })
        .await
        .unwrap()
        .into_inner()
        .group
        .unwrap();
    assert_eq!(group.max_items, 3, "the old policies stay in force");
}

/// With no Redis URL the service runs its own redis-server under data_dir,
/// keeps open groups across a restart, and stops the child cleanly.
#[tokio::test]
async fn embedded_redis_keeps_data_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &path,
        format!(
            "[redis]\ndata_dir = \"{}\"\n[defaults]\nmax_items = 5\n",
            data.display()
        ),
    )
    .unwrap();
    let mut first = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(first.addr).await;
    client.add(add("k", "a", b"kept")).await.unwrap();
    assert!(data.join("appendonlydir").is_dir());
    drop(client);
    first.signal(libc::SIGTERM);
    let status = first.wait_exit().await;
    assert!(status.success(), "clean exit: {status:?}\n{}", first.log());
    assert!(
        first.log().contains("embedded redis-server stopped"),
        "{}",
        first.log()
    );

    let second = support::serve(&path, dir.path()).start().await;
    let mut client = support::client(second.addr).await;
    let group = client
        .get_group(pb::GetGroupRequest { key: "k".into() })
        .await
        .unwrap()
        .into_inner()
        .group
        .expect("the open group survived the restart");
    assert_eq!(group.items[0].payload, b"kept");
}

/// Without redis-server installed, the service exits with one line saying how
/// to install it or how to pass a URL.
#[tokio::test]
async fn missing_redis_server_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(
        &path,
        format!(
            "[redis]\ndata_dir = \"{}\"\nredis_server = \"/nonexistent/redis-server\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let args = ["serve", "--listen", "127.0.0.1:0", "--config", path];
    let out = support::cli::run_with(&args, &[("RUST_LOG", "off")]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(stderr.contains("[redis] url"), "{stderr}");
}

/// A bad config file stops start-up with an error naming the file, table and field.
#[tokio::test]
async fn bad_config_names_file_table_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    std::fs::write(&path, "[keys.\"north\"]\nmax_items = 0\n").unwrap();
    let out = support::cli::run(&["serve", "--config", path.to_str().unwrap()]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("batcher.toml"), "{stderr}");
    assert!(stderr.contains("[keys.\"north\"]"), "{stderr}");
    assert!(stderr.contains("max_items"), "{stderr}");
    drop(dir);
}
