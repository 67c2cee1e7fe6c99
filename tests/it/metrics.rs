//! Metrics and logs against a real Redis: a real scrape of `GET /metrics`
//! before and after real traffic, the Grafana dashboard's queries against
//! the families the service exports, and JSON log lines from `batcher serve`.
//!
//! The metrics recorder is one per process, and every test of the binary
//! shares this one, so the tests that count run `batcher serve` as a child
//! process with a recorder of its own.

use crate::support;

use std::net::SocketAddr;

use crate::support::scrape::{Scrape, scrape};
use crate::support::{
    Process, RedisServer, add, config_text, eventually, next_batch, process_with,
};
use batcher::metrics::FAMILIES;
use batcher::pb;

type Client = pb::batcher_client::BatcherClient<tonic::transport::Channel>;

const POLICIES: &str = r#"
[defaults]
max_items = 3
max_wait = "1h"

[keys."t-*"]
max_wait = "200ms"
"#;

/// Waits until a scrape satisfies `test`, and returns it.
async fn scrape_until(addr: SocketAddr, what: &str, test: impl Fn(&Scrape) -> bool) -> Scrape {
    eventually(what, || async {
        let scrape = scrape(addr).await;
        test(&scrape).then_some(scrape)
    })
    .await
}

/// Real traffic moves the counters, histograms and gauges of `/metrics`:
/// adds and duplicates, size, timeout and manual flushes, lateness, open
/// groups, subscribers, consumer pending and lag, calls by code, and Redis
/// errors once Redis is gone.
#[tokio::test]
async fn metrics_move_with_real_traffic() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut process = process_with(dir.path(), &config_text(&redis.url(), POLICIES)).await;
    let http = process.http_addr().await;
    let mut client = support::client(process.addr).await;
    counters_and_histograms(http, &mut client).await;

    let groups = pb::ListGroupsRequest::default();
    let open = client.list_groups(groups).await.unwrap().into_inner();
    assert_eq!(open.groups.len(), 2);
    scrape_until(http, "the open groups gauge", |s| {
        s.value("batcher_open_groups", &[]) == Some(open.groups.len() as f64)
    })
    .await;

    subscribers_and_consumers(http, &mut client).await;

    redis.stop();
    let down = scrape(http).await;
    let status = client.add(add("k", "x", b"p")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let gone = scrape(http).await;
    let errors = batcher::metrics::REDIS_ERROR_KINDS
        .iter()
        .map(|kind| gone.delta(&down, "batcher_redis_errors_total", &[("kind", kind)]));
    assert!(errors.sum::<f64>() > 0.0);
    let unavailable = [("method", "Add"), ("code", "UNAVAILABLE")];
    assert_eq!(
        gone.delta(&down, "batcher_requests_total", &unavailable),
        1.0
    );
    process.stop().await;
}

/// Adds, a duplicate, size, manual and timeout flushes and a refused call
/// move the counters and histograms by exactly what they did.
async fn counters_and_histograms(http: SocketAddr, client: &mut Client) {
    let before = scrape(http).await;
    for id in ["a", "b", "c", "a"] {
        client.add(add("size", id, b"p")).await.unwrap();
    }
    client.add(add("manual", "m", b"p")).await.unwrap();
    let flush = pb::FlushRequest {
        key: "manual".into(),
    };
    client.flush(flush).await.unwrap();
    client.add(add("t-1", "t", b"p")).await.unwrap();
    client.add(add("open-1", "o", b"p")).await.unwrap();
    client.add(add("open-2", "o", b"p")).await.unwrap();
    let bad = client.add(add("", "x", b"p")).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    let flushed = "batcher_batches_flushed_total";
    let after = scrape_until(http, "the timeout flush", |s| {
        s.delta(&before, flushed, &[("reason", "timeout")]) > 0.0
    })
    .await;
    let delta = |name, labels: &[(&str, &str)]| after.delta(&before, name, labels);
    let added = "batcher_items_added_total";
    assert_eq!(delta(added, &[("outcome", "added")]), 7.0);
    assert_eq!(delta(added, &[("outcome", "duplicate")]), 1.0);
    for reason in ["size", "manual", "timeout"] {
        assert_eq!(delta(flushed, &[("reason", reason)]), 1.0, "{reason}");
    }
    assert_eq!(delta(flushed, &[("reason", "bytes")]), 0.0);
    assert_eq!(delta("batcher_flush_lateness_seconds_count", &[]), 1.0);
    assert_eq!(delta("batcher_batch_items_count", &[]), 3.0);
    assert_eq!(delta("batcher_batch_items_sum", &[]), 5.0);
    let calls = "batcher_requests_total";
    let invalid = [("method", "Add"), ("code", "INVALID_ARGUMENT")];
    assert_eq!(delta(calls, &invalid), 1.0);
    assert_eq!(delta(calls, &[("method", "Add"), ("code", "OK")]), 8.0);
    let flush_time = [("method", "Flush")];
    assert_eq!(
        delta("batcher_request_duration_seconds_count", &flush_time),
        1.0
    );
}

/// The subscribers gauge follows a live and a durable subscriber up and
/// back down; a durable consumer that has not acked shows as pending, and a
/// consumer group with no consumer as lag.
async fn subscribers_and_consumers(http: SocketAddr, client: &mut Client) {
    // Absent until a subscriber of the mode first came: none then.
    let subscribers = |s: &Scrape, mode| s.value("batcher_subscribers", &[("mode", mode)]);
    let was = |s: &Scrape, mode| subscribers(s, mode).unwrap_or(0.0);
    let durable = |group: &str, consumer: &str| pb::SubscribeRequest {
        consumer_group: group.into(),
        consumer: consumer.into(),
        ..Default::default()
    };
    let base = scrape(http).await;
    let live = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap();
    let mut reader = client
        .subscribe(durable("readers", "r1"))
        .await
        .unwrap()
        .into_inner();
    let idle = client.subscribe(durable("idle", "i1")).await.unwrap();
    scrape_until(http, "three subscribers", |s| {
        subscribers(s, "live") == Some(was(&base, "live") + 1.0)
            && subscribers(s, "durable") == Some(was(&base, "durable") + 2.0)
    })
    .await;
    // The idle group keeps its place in the streams with no consumer.
    drop(idle);
    scrape_until(http, "the idle consumer to leave", |s| {
        subscribers(s, "durable") == Some(was(&base, "durable") + 1.0)
    })
    .await;
    for id in ["x", "y", "z"] {
        client.add(add("size", id, b"p")).await.unwrap();
    }
    next_batch(&mut reader).await;
    let group = |s: &Scrape, name, group| s.value(name, &[("consumer_group", group)]);
    scrape_until(http, "pending and lag of the consumer groups", |s| {
        group(s, "batcher_consumer_pending", "readers") == Some(1.0)
            && group(s, "batcher_consumer_lag", "readers") == Some(0.0)
            && group(s, "batcher_consumer_pending", "idle") == Some(0.0)
            && group(s, "batcher_consumer_lag", "idle") == Some(1.0)
    })
    .await;
    let s = scrape(http).await;
    assert!(s.has("batcher_dead_letters", &[("consumer_group", "readers")]));
    drop((live, reader));
    scrape_until(http, "the subscribers to leave", |s| {
        subscribers(s, "live") == Some(was(&base, "live"))
            && subscribers(s, "durable") == Some(was(&base, "durable"))
    })
    .await;
}

/// Every query of the Grafana dashboard names only families the service
/// exports, and every family has a panel.
#[test]
fn dashboard_queries_name_exported_families() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/batcher.json");
    let text = std::fs::read_to_string(path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let mut queries = Vec::new();
    collect_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 12, "{queries:?}");
    let mut used = std::collections::BTreeSet::new();
    for query in &queries {
        for name in metric_names(query) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|f| FAMILIES.contains(f)))
                .unwrap_or(&name);
            assert!(
                FAMILIES.contains(&family),
                "{query} names {name}, not a family"
            );
            used.insert(family.to_owned());
        }
    }
    for family in FAMILIES {
        assert!(used.contains(*family), "no panel shows {family}");
    }
}

/// The PromQL of every `expr` and template variable `query` in `value`.
fn collect_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(q)) => {
                        out.push(q.clone())
                    }
                    _ => collect_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

/// The identifiers in a query that start with `batcher_`.
fn metric_names(query: &str) -> Vec<String> {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("batcher_"))
        .map(str::to_owned)
        .collect()
}

/// With `[log] format = "json"`, every line `batcher serve` writes is a JSON
/// object; at debug level each flush has a line with its key, reason, item
/// count and batch id, and no line holds a payload.
#[tokio::test]
async fn json_logs_have_a_line_per_flush_without_payloads() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batcher.toml");
    let extra = "[log]\nformat = \"json\"\n\n[defaults]\nmax_items = 1\n";
    let text = config_text(&redis.url(), extra);
    std::fs::write(&path, text).unwrap();
    let process = support::serve(&path, dir.path())
        .env("RUST_LOG", "info,batcher=debug")
        .start()
        .await;
    let mut client = support::client(process.addr).await;
    let reply = client
        .add(add("depot-7", "parcel-1", b"SECRET-PAYLOAD-TEXT"))
        .await
        .unwrap()
        .into_inner();
    let batch_id = reply.flushed.expect("a size flush").id;
    let line = json_line(&process, "flushed").await;
    assert_eq!(line["level"], "DEBUG", "{line}");
    assert_eq!(line["key"], "depot-7", "{line}");
    assert_eq!(line["reason"], "SIZE", "{line}");
    assert_eq!(line["items"], 1, "{line}");
    assert_eq!(line["batch_id"], batch_id.as_str(), "{line}");
    let log = process.log();
    assert!(!log.contains("SECRET-PAYLOAD-TEXT"), "{log}");
    for line in complete_lines(&log) {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value.is_object(), "{line}");
    }
    assert!(log.contains("serving http"), "{log}");
}

/// `worker_threads` sizes the service's runtime: the runtime itself reports
/// 3 workers in the "serving" line when the file asks for 3, 2 for 2, and
/// one on a single Redis when the file leaves the field out.
#[tokio::test]
async fn worker_threads_sizes_the_runtime() {
    let redis = RedisServer::start();
    for (field, want) in [
        ("worker_threads = 3\n", 3),
        ("worker_threads = 2\n", 2),
        ("", 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("batcher.toml");
        let extra = format!("{field}[log]\nformat = \"json\"\n");
        std::fs::write(&path, config_text(&redis.url(), &extra)).unwrap();
        let process = support::serve(&path, dir.path()).start().await;
        let line = json_line(&process, "serving").await;
        assert_eq!(line["worker_threads"], want, "{field:?}: {line}");
    }
}

/// The first JSON line of `process`'s log whose message is `message`,
/// waited for.
async fn json_line(process: &Process, message: &str) -> serde_json::Value {
    eventually(&format!("the {message:?} log line"), || {
        let log = process.log();
        async move {
            complete_lines(&log)
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|l| l["message"] == message)
        }
    })
    .await
}

/// The lines of `log` that the process has finished writing.
fn complete_lines(log: &str) -> impl Iterator<Item = &str> {
    log.rsplit_once('\n').map_or("", |(done, _)| done).lines()
}

/// The gauges of the limits on open groups follow real groups: the groups
/// open under each limit, the limit itself, and the oldest one's age; a
/// refused add counts as `refused`.
#[tokio::test]
async fn limit_gauges_show_open_groups_against_each_limit() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // 4 shards: max_groups = 4 lets each shard hold 1 scan-* group.
    let extra = "[limits]\nmax_open_groups = 40\n[keys.\"scan-*\"]\nmax_groups = 4\n";
    let mut process = process_with(dir.path(), &config_text(&redis.url(), extra)).await;
    let http = process.http_addr().await;
    let mut client = support::client(process.addr).await;
    client.add(add("area-1", "p", b"p")).await.expect("add");
    let before = scrape(http).await;
    let mut accepted = 0;
    for n in 0.. {
        assert!(n < 5, "4 shards of 1 scan-* group each took a fifth");
        match client.add(add(&format!("scan-{n}"), "p", b"p")).await {
            Ok(_) => accepted += 1,
            Err(refused) => {
                assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
                break;
            }
        }
    }
    let service = [("limit", "limits.max_open_groups")];
    let scan = [("limit", "policies/keys/scan-*.max_groups")];
    let scraped = scrape_until(http, "the limit gauges", |s| {
        s.value("batcher_limited_open_groups", &service) == Some(f64::from(accepted + 1))
            && s.value("batcher_limited_open_groups", &scan) == Some(f64::from(accepted))
    })
    .await;
    assert_eq!(scraped.get("batcher_open_groups_limit", &service), 40.0);
    assert_eq!(scraped.get("batcher_open_groups_limit", &scan), 4.0);
    let age = scraped.get("batcher_oldest_limited_group_age_seconds", &[]);
    assert!((0.0..60.0).contains(&age), "{age}");
    let outcome = [("outcome", "refused")];
    assert_eq!(
        scraped.delta(&before, "batcher_items_added_total", &outcome),
        1.0
    );
    process.stop().await;
}
