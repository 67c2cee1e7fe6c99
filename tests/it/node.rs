//! The Node client in `clients/node` against a real service: its own tests
//! (`node --test`, in `clients/node/test`) run the producer, the live
//! subscriber with resume by cursor, the durable consumer with acks and
//! redelivery, and the three example programs, with a bearer token.
//!
//! `scripts/ensure-node` installs node and the client's locked dependencies
//! (`npm ci`) when they are missing; the first run fetches them from npm.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::support::{RedisServer, Service, config};

/// Three items a group (ten for the examples' `example-*` keys), no flush
/// by time within a test, and an ack timeout short enough to wait for a
/// redelivery, long enough that a prompt ack always beats it: the node
/// tests rely on each of these.
const POLICY: &str = "[defaults]\nmax_items = 3\nmax_wait = \"10m\"\n\
                      [keys.\"example-*\"]\nmax_items = 10\n\
                      [subscriptions]\nack_timeout = \"2s\"\nmax_deliveries = 100\n";

/// How long the whole `node --test` run may take: its tests wait up to 15 s
/// each for an event, and run one file at a time on a small machine.
const NODE_DEADLINE: Duration = Duration::from_secs(180);

/// The client's directory in this checkout.
fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/node")
}

/// Runs `scripts/ensure-node`; panics with its output unless it succeeds.
fn ensure_node() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ensure-node");
    let output = std::process::Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{} could not start: {e}", script.display()));
    assert!(
        output.status.success(),
        "scripts/ensure-node failed ({})\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The client's test files, `test/*.test.js`, sorted.
fn test_files() -> Vec<PathBuf> {
    let dir = client_dir().join("test");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.to_string_lossy().ends_with(".test.js"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no test files in {}", dir.display());
    files
}

/// The Node client's own tests pass against a real service that requires a
/// bearer token.
#[tokio::test(flavor = "multi_thread")]
async fn the_node_client_passes_its_tests_against_a_real_service() {
    ensure_node();
    let redis = RedisServer::start();
    let token = format!("node-{:016x}", rand::random::<u64>());
    let auth = format!(
        "[[auth.tokens]]\nname = \"node\"\nsha256 = \"{:x}\"\nroles = [\"admin\"]\n",
        Sha256::digest(token.as_bytes())
    );
    let service = Service::start(config(&redis.url(), &format!("{POLICY}{auth}"))).await;

    let out = tempfile::tempdir().expect("temp dir");
    let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut node = tokio::process::Command::new("node")
        .args(["--test", "--test-reporter=tap"])
        .args(test_files())
        .current_dir(client_dir())
        .env("BATCHER_ADDR", service.addr.to_string())
        .env("BATCHER_TOKEN", &token)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        // Its own process group, so that a timeout ends the runner and the
        // processes it runs the test files in.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("node could not start; run scripts/ensure-node");
    let status = tokio::time::timeout(NODE_DEADLINE, node.wait()).await;
    if status.is_err() {
        let group = node.id().expect("a running node") as i32;
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let (stdout, stderr) = (read(&stdout), read(&stderr));
    let passed = matches!(status, Ok(Ok(status)) if status.success());
    assert!(
        passed,
        "node --test failed ({status:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for line in ["# fail 0", "# cancelled 0", "# skipped 0"] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }
    service.stop().await;
}
