//! The Redis layout is cluster-ready: every script call gets all of its keys
//! through KEYS, and they all hash to one Redis Cluster slot.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use support::{RedisServer, Service, add, config, eventually, next_batch};
use tonic::transport::Channel;

/// The Redis Cluster slot of a key, computed independently of the service's
/// own code: CRC16/XMODEM of the hash tag (or the whole key), modulo 16384.
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16384
}

/// Splits one MONITOR line into its arguments, undoing redis-cli's quoting.
fn monitor_args(line: &str) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    let mut chars = line.bytes().peekable();
    while let Some(c) = chars.next() {
        if c != b'"' {
            continue;
        }
        let mut arg = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                b'"' => break,
                b'\\' => match chars.next() {
                    Some(b'x') => {
                        let hex: String = [chars.next().unwrap(), chars.next().unwrap()]
                            .iter()
                            .map(|b| *b as char)
                            .collect();
                        arg.push(u8::from_str_radix(&hex, 16).unwrap());
                    }
                    Some(b'n') => arg.push(b'\n'),
                    Some(b'r') => arg.push(b'\r'),
                    Some(b't') => arg.push(b'\t'),
                    Some(other) => arg.push(other),
                    None => break,
                },
                other => arg.push(other),
            }
        }
        args.push(arg);
    }
    args
}

/// A `redis-cli MONITOR` writing every command Redis receives to a file.
struct Monitor {
    child: Child,
    log: PathBuf,
}

impl Monitor {
    /// Starts MONITOR and waits until it records.
    async fn start(redis: &RedisServer) -> Monitor {
        let log = redis.dir().join("monitor.log");
        let child = Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "MONITOR"])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let monitor = Monitor { child, log };
        eventually("MONITOR to start", || {
            redis.cli(&["PING"]);
            let text = monitor.text();
            async move { text.contains("\"PING\"").then_some(()) }
        })
        .await;
        monitor
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until MONITOR has recorded everything sent so far, stops it and
    /// returns what it recorded.
    async fn finish(mut self, redis: &RedisServer) -> String {
        redis.cli(&["ECHO", "layout-done"]);
        let text = eventually("the monitor to catch up", || {
            let text = self.text();
            async move { text.contains("layout-done").then_some(text) }
        })
        .await;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        text
    }
}

/// Adds (flushing by size and bytes), removes, flushes by hand and by
/// timeout, with keys that contain braces.
async fn exercise_groups(client: &mut BatcherClient<Channel>) {
    let mut batches = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let keys = ["north", "south-1", "{odd}key", "}{", "a{b}c", "ключ"];
    let items = keys
        .iter()
        .flat_map(|k| (0..4).map(move |i| add(k, &format!("id{i}"), b"payload")))
        .collect();
    client.add_many(pb::AddManyRequest { items }).await.unwrap();
    client.add(add("big", "x", &[7u8; 64])).await.unwrap();
    client.add(add("manual", "x", b"")).await.unwrap();
    client.add(add("manual", "y", b"")).await.unwrap();
    let remove = pb::RemoveRequest {
        key: "manual".into(),
        item_id: b"y".to_vec(),
    };
    client.remove(remove).await.unwrap();
    let flush = pb::FlushRequest {
        key: "manual".into(),
    };
    client.flush(flush).await.unwrap();
    client.add(add("timeout", "x", b"")).await.unwrap();
    while next_batch(&mut batches).await.key != "timeout" {}
}

/// A durable subscription: delivers, times out into the dead letters, is
/// re-driven and acked.
async fn exercise_durable(client: &mut BatcherClient<Channel>) {
    let mut durable = client
        .subscribe(pb::SubscribeRequest {
            consumer_group: "g".into(),
            consumer: "c".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    client.add(add("durable", "x", b"")).await.unwrap();
    let flush = pb::FlushRequest {
        key: "durable".into(),
    };
    client.flush(flush).await.unwrap();
    let first = next_batch(&mut durable).await;
    eventually("the batch to be dead-lettered", || {
        let mut client = client.clone();
        async move {
            let request = pb::ListDeadLettersRequest {
                consumer_group: "g".into(),
                limit: 0,
            };
            let dead = client.list_dead_letters(request).await.unwrap();
            (!dead.into_inner().batches.is_empty()).then_some(())
        }
    })
    .await;
    let redrive = pb::RedriveRequest {
        consumer_group: "g".into(),
        batch_ids: vec![first.id.clone()],
    };
    client.redrive(redrive).await.unwrap();
    let again = next_batch(&mut durable).await;
    assert_eq!(again.id, first.id, "{first:?} / {again:?}");
    let ack = pb::AckRequest {
        consumer_group: "g".into(),
        batch_ids: vec![again.id],
    };
    client.ack(ack).await.unwrap();
}

/// Checks every script call MONITOR recorded: it has keys, and they share one
/// slot. Returns how many calls and how many distinct scripts there were.
fn check_script_calls(text: &str) -> (usize, usize) {
    let mut calls = 0;
    let mut scripts_seen = std::collections::HashSet::new();
    for line in text.lines() {
        let args = monitor_args(line);
        let Some(command) = args.first() else {
            continue;
        };
        let command = String::from_utf8_lossy(command).to_uppercase();
        if command != "EVALSHA" && command != "EVAL" {
            continue;
        }
        calls += 1;
        scripts_seen.insert(args[1].clone());
        let numkeys: usize = String::from_utf8_lossy(&args[2]).parse().unwrap();
        let keys = &args[3..3 + numkeys];
        assert!(!keys.is_empty(), "a script call without keys: {line}");
        let first = slot(&keys[0]);
        for key in keys {
            assert_eq!(slot(key), first, "script keys span slots: {line}");
        }
    }
    (calls, scripts_seen.len())
}

/// Records every command the service sends while it adds, flushes (by size,
/// bytes, hand and timeout), removes, serves live and durable subscribers,
/// dead-letters, re-drives and acks, and checks that
/// each script call's keys, including keys with braces, share one slot.
#[tokio::test]
async fn every_script_call_stays_in_one_slot() {
    let redis = RedisServer::start();
    let monitor = Monitor::start(&redis).await;
    let extra = r#"
[defaults]
max_items = 3
max_wait = "200ms"
max_bytes = "64B"
[subscriptions]
ack_timeout = "100ms"
max_deliveries = 1
"#;
    let service = Service::start(config(&redis.url(), extra)).await;
    let mut client = service.client().await;
    exercise_groups(&mut client).await;
    exercise_durable(&mut client).await;
    service.stop().await;
    let (calls, scripts) = check_script_calls(&monitor.finish(&redis).await);
    assert!(calls > 10, "only {calls} script calls were recorded");
    // add, flush, due-groups and remove scripts were all exercised (EVAL and
    // EVALSHA of one script count once each at most).
    assert!(scripts >= 4, "{scripts} distinct scripts");
}
