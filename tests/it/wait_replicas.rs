//! `wait_replicas` on one Redis with a replica: a write is acknowledged only
//! once the replica confirms it, fails with UNAVAILABLE when it cannot, and
//! retrying that call is safe.

use crate::support::{RedisServer, Service, add, eventually};
use batcher::config::Config;
use batcher::pb;

/// Whether `primary` has `replicas` replicas online.
fn replicas_online(primary: &RedisServer, replicas: usize) -> bool {
    let info = primary.cli(&["INFO", "replication"]);
    info.contains(&format!("connected_slaves:{replicas}"))
        && info.matches("state=online").count() == replicas
}

/// With `wait_replicas = 1`, adds succeed while the replica confirms them;
/// with the replica down they fail UNAVAILABLE, saying how many replicas
/// confirmed; once it is back, retrying the failed add answers DUPLICATE
/// (its write had landed) and the group holds the item once.
#[tokio::test]
async fn writes_wait_for_a_replica() {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let mut replica = RedisServer::builder()
        .extra_arg("--replicaof")
        .extra_arg("127.0.0.1")
        .extra_arg(&port)
        .start();
    eventually("the replica to come online", || async {
        replicas_online(&primary, 1).then_some(())
    })
    .await;
    // A replica on a busy machine can take well over 100 ms to confirm; a
    // second leaves room, and stays within the 2 s response timeout.
    let text = format!(
        "[redis]\nurl = \"{}\"\nshards = 4\nwait_replicas = 1\nwait_timeout = \"1s\"\n",
        primary.url()
    );
    let service = Service::start(Config::parse(&text, "test.toml").unwrap()).await;
    let mut client = service.client().await;

    let first = client.add(add("area", "p1", b"x")).await.unwrap();
    assert_eq!(first.into_inner().outcome, pb::AddOutcome::Added as i32);

    replica.kill();
    let status = client.add(add("area", "p2", b"y")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("0 of 1 replicas confirmed"),
        "{status:?}"
    );

    replica.restart();
    eventually("the replica to be back online", || async {
        replicas_online(&primary, 1).then_some(())
    })
    .await;
    let retry = client.add(add("area", "p2", b"y")).await.unwrap();
    assert_eq!(retry.into_inner().outcome, pb::AddOutcome::Duplicate as i32);
    let request = pb::GetGroupRequest { key: "area".into() };
    let group = client.get_group(request).await.unwrap().into_inner().group;
    let ids: Vec<String> = group.unwrap().items.into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["p1", "p2"]);
    service.stop().await;
}
