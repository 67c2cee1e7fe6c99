//! The layout check: `redis-cli MONITOR` records every command a server
//! receives (scripts, the commands scripts run, plain commands, pipelines)
//! while [`exercise`] drives every flow of the service, and [`check_layout`]
//! asks that server's `COMMAND GETKEYS` for each command's keys and asserts
//! they all share one hash tag, so each command stays in one Redis Cluster
//! slot. Used on a single node (tests/layout.rs) and on every master of a
//! cluster (tests/cluster.rs).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use tonic::transport::Channel;

use super::redis::cli;
use super::{add, eventually, next_batch};

/// The config tables [`exercise`] needs: small thresholds, quick timeouts,
/// one delivery before a batch is dead-lettered.
pub const LAYOUT_CONFIG: &str = r#"
[defaults]
max_items = 3
max_wait = "200ms"
max_bytes = "64B"
[subscriptions]
ack_timeout = "100ms"
max_deliveries = 1
"#;

/// A `redis-cli MONITOR` writing every command one server receives to a file.
pub struct Monitor {
    port: u16,
    child: Child,
    log: PathBuf,
    /// Holds the log; declared last so it outlives the child.
    _dir: tempfile::TempDir,
}

impl Monitor {
    /// Starts MONITOR on the server at `port` and waits until it records.
    pub async fn start(port: u16) -> Monitor {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("monitor.log");
        let child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "MONITOR"])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let monitor = Monitor {
            port,
            child,
            log,
            _dir: dir,
        };
        eventually("MONITOR to start", || {
            cli(port, &["PING"]);
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
    pub async fn finish(mut self) -> String {
        cli(self.port, &["ECHO", "layout-done"]);
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

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What [`check_layout`] saw.
#[derive(Debug, Default)]
pub struct Layout {
    /// Commands recorded.
    pub commands: usize,
    /// Commands that have keys.
    pub keyed: usize,
    /// Upper-cased names of every command recorded.
    pub names: HashSet<String>,
    /// Distinct scripts and functions (the sha or source of EVALSHA/EVAL
    /// calls, the function name of FCALL calls).
    pub scripts: HashSet<Vec<u8>>,
}

/// Checks every command of a MONITOR `text` recorded on the server at
/// `port`: the keys `COMMAND GETKEYS` finds in it all have the same,
/// non-empty hash tag. Panics naming the first line that breaks this.
pub fn check_layout(port: u16, text: &str) -> Layout {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("] \"")).collect();
    let commands: Vec<Vec<Vec<u8>>> = lines.iter().map(|l| monitor_args(l)).collect();
    let mut layout = Layout {
        commands: commands.len(),
        ..Layout::default()
    };
    for args in &commands {
        let name = String::from_utf8_lossy(&args[0]).to_uppercase();
        if matches!(name.as_str(), "EVALSHA" | "EVAL" | "FCALL" | "FCALL_RO") {
            layout.scripts.insert(args[1].clone());
        }
        layout.names.insert(name);
    }
    // A bare command name has no keys (and GETKEYS wants an argument).
    let (lines, commands): (Vec<&str>, Vec<_>) = lines
        .into_iter()
        .zip(commands)
        .filter(|(_, args)| args.len() > 1)
        .unzip();
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for args in &commands {
        pipe.cmd("COMMAND").arg("GETKEYS").arg(args);
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut con = client.get_connection().unwrap();
    let replies: Vec<redis::Value> = pipe.query(&mut con).unwrap();
    for (line, reply) in lines.iter().zip(replies) {
        let keys: Vec<Vec<u8>> = match reply {
            redis::Value::ServerError(e) => {
                let what = e.details().unwrap_or_default();
                assert!(what.contains("no key"), "COMMAND GETKEYS {line}: {e:?}");
                continue;
            }
            value => redis::from_redis_value(value).unwrap(),
        };
        layout.keyed += 1;
        let first = hash_tag(&keys[0]);
        assert!(!first.is_empty(), "a key without a hash tag: {line}");
        for key in &keys {
            assert_eq!(hash_tag(key), first, "keys span hash tags: {line}");
        }
    }
    layout
}

/// The hash tag of a key as Redis Cluster finds it: between the first `{`
/// and the next `}`, if that is not empty; otherwise empty.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|b| *b == b'{') else {
        return &[];
    };
    match key[open + 1..].iter().position(|b| *b == b'}') {
        Some(len) => &key[open + 1..open + 1 + len],
        None => &[],
    }
}

/// Splits one MONITOR line into its arguments, undoing redis-cli's quoting.
pub fn monitor_args(line: &str) -> Vec<Vec<u8>> {
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
                    Some(b'a') => arg.push(7),
                    Some(b'b') => arg.push(8),
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

/// Drives every flow of a service configured with [`LAYOUT_CONFIG`]: adds
/// (flushing by size and bytes), removes, flushes by hand and by timeout,
/// with keys that contain braces, group reads, and a durable subscription
/// that dead-letters, re-drives and acks.
pub async fn exercise(client: &mut BatcherClient<Channel>) {
    exercise_groups(client).await;
    exercise_durable(client).await;
}

/// The group flows of [`exercise`].
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
        item_id: "y".into(),
    };
    client.remove(remove).await.unwrap();
    let get = pb::GetGroupRequest {
        key: "manual".into(),
    };
    client.get_group(get).await.unwrap();
    client
        .list_groups(pb::ListGroupsRequest::default())
        .await
        .unwrap();
    let flush = pb::FlushRequest {
        key: "manual".into(),
    };
    client.flush(flush).await.unwrap();
    client.add(add("timeout", "x", b"")).await.unwrap();
    while next_batch(&mut batches).await.key != "timeout" {}
}

/// The durable flows of [`exercise`].
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
                page_size: 0,
                ..Default::default()
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
