//! The drain on SIGTERM (docs/operations.md, "Drain"), on the service as a
//! child process: readiness goes false while the service serves on, then
//! the listener closes, subscription streams end UNAVAILABLE, durable
//! deliveries move to another instance at once, and a second signal ends it
//! all at once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::support::{
    self, DEADLINE, RedisServer, Service, add, add_many, config, config_text, eventually,
    next_batch, process_with, wait_health,
};

/// `GET path` at `addr`: the response's status code, or None when the
/// connection is refused or cut.
async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: batcher\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.ok()?;
    response.split(' ').nth(1)?.parse().ok()
}

/// The Batcher service's health at `addr` on a new connection, or None when
/// the connection is refused (the listener has closed).
async fn health_on_new_connection(addr: SocketAddr) -> Option<ServingStatus> {
    let endpoint = support::channel(addr);
    let mut health = HealthClient::new(endpoint);
    let service = "batcher.v1.Batcher".to_owned();
    let reply = health.check(HealthCheckRequest { service }).await.ok()?;
    ServingStatus::try_from(reply.into_inner().status).ok()
}

/// What one look at a draining instance saw.
#[derive(Debug)]
struct Look {
    /// Since the signal, when gRPC health answered or was refused.
    at: Duration,
    /// gRPC health on a new connection; None: refused.
    grpc: Option<ServingStatus>,
    /// `GET /readyz`; None: refused.
    readyz: Option<u16>,
    /// `GET /livez`.
    livez: Option<u16>,
}

/// From SIGTERM, gRPC health and `/readyz` report NOT_SERVING (503) while the
/// listener still takes connections and calls are served, `/livez` stays
/// 200, and only after `drain_delay` does the listener close.
#[tokio::test]
async fn readiness_goes_false_before_the_listener_closes() {
    const DELAY: Duration = Duration::from_millis(1500);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&redis.url(), "drain_delay = \"1500ms\"\n");
    let mut process = process_with(dir.path(), &text).await;
    let http = process.http_addr().await;
    wait_health(process.addr, ServingStatus::Serving).await;
    assert_eq!(http_status(http, "/readyz").await, Some(200));
    assert_eq!(http_status(http, "/livez").await, Some(200));

    let signalled = Instant::now();
    process.signal(libc::SIGTERM);
    let addr = process.addr;
    // Looks every 10 ms, each on new connections, until the listener refuses.
    let mut looks = Vec::new();
    let mut served_while_not_ready = false;
    loop {
        assert!(
            signalled.elapsed() < DEADLINE,
            "the listener never closed: {looks:#?}"
        );
        // HTTP first: its listener closes after the gRPC one, so a look
        // that finds gRPC open found HTTP open too.
        let livez = http_status(http, "/livez").await;
        let readyz = http_status(http, "/readyz").await;
        let grpc = health_on_new_connection(addr).await;
        let at = signalled.elapsed();
        if grpc == Some(ServingStatus::NotServing) && !served_while_not_ready {
            // Still serving: an add on a new connection is answered.
            let mut client = BatcherClient::new(support::channel(addr));
            served_while_not_ready = client.add(add("k", "during", b"")).await.is_ok();
        }
        looks.push(Look {
            at,
            grpc,
            readyz,
            livez,
        });
        if grpc.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let first_not_ready = looks
        .iter()
        .position(|l| l.grpc == Some(ServingStatus::NotServing) && l.readyz == Some(503))
        .unwrap_or_else(|| panic!("never NOT_SERVING with the listener open: {looks:#?}"));
    let closing = looks.len() - 1;
    for look in &looks[first_not_ready..closing] {
        assert_eq!(look.grpc, Some(ServingStatus::NotServing), "{looks:#?}");
        assert_eq!(look.readyz, Some(503), "{looks:#?}");
        assert_eq!(look.livez, Some(200), "{looks:#?}");
    }
    assert!(
        looks[closing].at >= DELAY,
        "the listener closed before drain_delay: {looks:#?}"
    );
    assert!(
        served_while_not_ready,
        "an add failed while NOT_SERVING: {looks:#?}"
    );
    let status = process.wait_exit().await;
    assert!(status.success(), "{status:?}\n{}", process.log());
    let log = process.log();
    for step in [
        "drain: health is NOT_SERVING",
        "drain: listener closed and GOAWAY sent",
        "drain: every call answered",
        "drain: background tasks stopped",
    ] {
        assert!(log.contains(step), "no {step:?} in the log:\n{log}");
    }
}

/// A live subscription stream ends UNAVAILABLE when its instance drains,
/// with a message that says to resume by cursor, after the batches before.
#[tokio::test]
async fn live_streams_end_unavailable() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let extra = "drain_delay = \"100ms\"\n[defaults]\nmax_items = 1\n";
    let mut process = process_with(dir.path(), &config_text(&redis.url(), extra)).await;
    let mut client = support::client(process.addr).await;
    let request = pb::SubscribeRequest {
        after: "0".into(),
        ..Default::default()
    };
    let mut stream = client.subscribe(request).await.unwrap().into_inner();
    let flushed = client.add(add("k", "one", b"")).await.unwrap();
    let batch = next_batch(&mut stream).await;
    assert_eq!(Some(batch.id), flushed.into_inner().flushed.map(|b| b.id));

    process.signal(libc::SIGTERM);
    let end = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("the stream did not end");
    let status = end.expect_err("the stream ended with OK");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("cursor"), "{status:?}");
    assert!(process.wait_exit().await.success(), "{}", process.log());
}

/// The batches a durable consumer holds unacked on a draining instance go
/// to the group's consumer on another instance within a second of its
/// stream's end, though the ack timeout is a minute; its stream ends
/// UNAVAILABLE.
#[tokio::test]
async fn durable_deliveries_move_on_at_once() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let durable = "[defaults]\nmax_items = 1\n[subscriptions]\nack_timeout = \"60s\"\n";
    let text = config_text(&redis.url(), &format!("drain_delay = \"100ms\"\n{durable}"));
    let mut draining = process_with(dir.path(), &text).await;
    let other = Service::start(config(&redis.url(), durable)).await;

    let mut client = support::client(draining.addr).await;
    let mut held = subscribe(&mut client, "g", "a").await;
    let items = (0..5).map(|i| add("k", &format!("i{i}"), b"")).collect();
    let ids: HashSet<String> = add_many(&mut client, items)
        .await
        .into_iter()
        .map(|r| r.flushed.expect("max_items = 1 flushes every add").id)
        .collect();
    for _ in 0..ids.len() {
        let batch = next_batch(&mut held).await;
        assert!(ids.contains(&batch.id), "{batch:?}");
    }
    let mut elsewhere = subscribe(&mut other.client().await, "g", "b").await;

    draining.signal(libc::SIGTERM);
    let end = tokio::time::timeout(DEADLINE, held.message())
        .await
        .expect("the durable stream did not end");
    let status = end.expect_err("the durable stream ended with OK");
    let ended = Instant::now();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let mut moved = HashSet::new();
    while moved.len() < ids.len() {
        let batch = next_batch(&mut elsewhere).await;
        assert!(ids.contains(&batch.id), "{batch:?}");
        assert_eq!(batch.delivery_count, 2, "{batch:?}");
        moved.insert(batch.id);
    }
    let took = ended.elapsed();
    eprintln!("durable deliveries moved {took:?} after the stream ended");
    assert!(
        took < Duration::from_secs(1),
        "the held batches moved {took:?} after the drain, not within a second"
    );
    assert!(draining.wait_exit().await.success(), "{}", draining.log());
    assert!(
        draining
            .log()
            .contains("drain: released the batches a durable consumer held"),
        "{}",
        draining.log()
    );
    other.stop().await;
}

/// A durable subscription of `consumer` in `group` (created if need be).
async fn subscribe(
    client: &mut BatcherClient<Channel>,
    group: &str,
    consumer: &str,
) -> tonic::Streaming<pb::Batch> {
    let request = pb::SubscribeRequest {
        consumer_group: group.into(),
        consumer: consumer.into(),
        ..Default::default()
    };
    client.subscribe(request).await.unwrap().into_inner()
}

/// A second SIGTERM during the drain's delay ends the service at once,
/// long before the delay would have.
#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(&redis.url(), "drain_delay = \"1h\"\n");
    let mut process = process_with(dir.path(), &text).await;
    wait_health(process.addr, ServingStatus::Serving).await;
    process.signal(libc::SIGTERM);
    wait_health(process.addr, ServingStatus::NotServing).await;
    let second = Instant::now();
    process.signal(libc::SIGTERM);
    let status = process.wait_exit().await;
    assert!(status.success(), "{status:?}\n{}", process.log());
    assert!(
        second.elapsed() < Duration::from_secs(10),
        "{:?} after the second signal",
        second.elapsed()
    );
    assert!(
        process.log().contains("a second signal"),
        "{}",
        process.log()
    );
}

/// Waits until `GET /readyz` at `http` answers `want`.
async fn wait_readyz(http: SocketAddr, want: u16) {
    eventually(&format!("/readyz to answer {want}"), || async move {
        (http_status(http, "/readyz").await == Some(want)).then_some(())
    })
    .await;
}

/// `GET /readyz` follows Redis as gRPC health does: 503 while Redis is
/// down, 200 once it is back; `/livez` stays 200 throughout.
#[tokio::test]
async fn readyz_follows_redis() {
    let mut redis = RedisServer::start();
    let service = Service::start(config(&redis.url(), "")).await;
    let http = service.http_addr.expect("[http] is on");
    wait_readyz(http, 200).await;
    redis.stop();
    wait_readyz(http, 503).await;
    wait_health(service.addr, ServingStatus::NotServing).await;
    assert_eq!(http_status(http, "/livez").await, Some(200));
    redis.restart();
    wait_readyz(http, 200).await;
    wait_health(service.addr, ServingStatus::Serving).await;
    service.stop().await;
}
