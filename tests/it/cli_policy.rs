//! `batcher policy ...` run as the built binary against a real service with
//! [policy_store] on: set and get (text and JSON), the limit on open
//! groups, a stale etag refused, list and delete, the history, and import
//! and diff of a config file.

use std::net::SocketAddr;
use std::path::PathBuf;

use batcher::pb;

use crate::support::cli::{at, failed, json_lines, ok};
use crate::support::{RedisServer, Service, config, eventually};

/// A service over a fresh Redis with the store on, seeded from `policies`
/// (the file's tables), once the store has loaded.
async fn store(policies: &str) -> (RedisServer, Service) {
    let redis = RedisServer::start();
    let text = format!("{policies}\n[policy_store]\nenabled = true\ncheck_every = \"100ms\"\n");
    let service = Service::start(config(&redis.url(), &text)).await;
    let client = service.client().await;
    let loaded = eventually("the store to load", || {
        let mut c = client.clone();
        async move {
            let list = c.list_policies(pb::ListPoliciesRequest::default());
            list.await.ok()
        }
    });
    loaded.await;
    (redis, service)
}

/// The stdout of `batcher policy ARGS` against `addr`, which must succeed.
async fn policy(addr: SocketAddr, args: &[&str]) -> String {
    ok(&at(addr, &[&["policy"], args].concat()).await)
}

/// The one JSON object `batcher policy ARGS --json` prints.
async fn policy_json(addr: SocketAddr, args: &[&str]) -> serde_json::Value {
    let lines = json_lines(&policy(addr, &[args, &["--json"]].concat()).await);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.into_iter().next().unwrap()
}

/// The value of the `label:` row of a `policy get` text.
fn row<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let label = format!("{label}:");
    let found = text.lines().find(|l| l.starts_with(&format!("{label} ")));
    found.map(|l| l[label.len()..].trim())
}

/// `set` changes only the fields it names (set or --unset), keeping the
/// others; `get` shows them as text and in the protobuf JSON mapping.
#[tokio::test]
async fn set_changes_the_named_fields_and_get_shows_them() {
    let (_redis, service) = store("[keys.\"north-*\"]\nmax_items = 10\nmax_idle = \"5m\"\n").await;
    let addr = service.addr;
    let set = [
        "set",
        "north-*",
        "--max-wait",
        "2h",
        "--capacity",
        "weight_g=24000000",
        "--cutoffs",
        "11:30,17:45",
        "--timezone",
        "Europe/Berlin",
        "--unset",
        "max_idle",
    ];
    let text = policy(addr, &set).await;
    assert_eq!(row(&text, "name"), Some("policies/keys/north-*"), "{text}");
    assert_eq!(row(&text, "max_items"), Some("10"), "kept: {text}");
    assert_eq!(row(&text, "max_wait"), Some("2h"), "{text}");
    assert_eq!(row(&text, "capacity"), Some("weight_g=24000000"), "{text}");
    assert_eq!(row(&text, "cutoffs"), Some("11:30,17:45"), "{text}");
    assert_eq!(row(&text, "max_idle"), None, "unset: {text}");
    assert!(
        row(&text, "from defaults").unwrap().contains("max_idle"),
        "{text}"
    );
    assert!(
        row(&text, "updated by")
            .unwrap()
            .starts_with("peer 127.0.0.1:")
    );

    assert_eq!(policy(addr, &["get", "policies/keys/north-*"]).await, text);
    let json = policy_json(addr, &["get", "north-*"]).await;
    assert_eq!(json["name"], "policies/keys/north-*");
    assert_eq!(json["maxItems"], 10);
    assert_eq!(json["maxWait"], "7200s");
    assert_eq!(json["capacity"]["limits"]["weight_g"], "24000000");
    assert_eq!(
        json["cutoffs"]["times"],
        serde_json::json!(["11:30", "17:45"])
    );
    assert_eq!(json["timezone"], "Europe/Berlin");
    assert!(json.get("maxIdle").is_none(), "{json}");
    assert_eq!(json["etag"], row(&text, "etag").unwrap());

    let nothing = at(addr, &["policy", "set", "north-*"]).await;
    assert!(failed(&nothing, 1).contains("nothing to change"));
    let bad = at(addr, &["policy", "set", "south", "--min-items", "5"]).await;
    let stderr = failed(&bad, 1);
    assert!(stderr.contains("INVALID_ARGUMENT"), "{stderr}");
    service.stop().await;
}

/// `--max-groups` and `--overflow` set the limit on open groups and what
/// an add past it does: `get` shows them (text and JSON), the history
/// records them in the config file's forms, a file with the same table
/// has no differences, `--unset` clears one, and a bad overflow name is
/// refused before any call.
#[tokio::test]
async fn the_open_group_limit_round_trips() {
    let (_redis, service) = store("[keys.\"scan-*\"]\nmax_items = 10\n").await;
    let addr = service.addr;
    let set = [
        "set",
        "scan-*",
        "--max-groups",
        "500",
        "--overflow",
        "flush_oldest",
    ];
    let text = policy(addr, &set).await;
    assert_eq!(row(&text, "max_groups"), Some("500"), "{text}");
    assert_eq!(row(&text, "overflow"), Some("flush_oldest"), "{text}");
    assert_eq!(row(&text, "max_items"), Some("10"), "kept: {text}");
    let json = policy_json(addr, &["get", "scan-*"]).await;
    assert_eq!(
        (&json["maxGroups"], &json["overflow"]),
        (&500.into(), &"flush_oldest".into())
    );
    let defaults = policy_json(addr, &["get", "defaults"]).await;
    let off = (&defaults["maxGroups"], &defaults["overflow"]);
    assert_eq!(off, (&0.into(), &"refuse".into()), "{defaults}");

    let history = policy(addr, &["history", "scan-*", "--page-size", "1"]).await;
    let lines: Vec<&str> = history.lines().skip(1).collect();
    let change = [
        "  UPDATED policies/keys/scan-*",
        "    max_groups: null -> 500",
        "    overflow: null -> \"flush_oldest\"",
    ];
    assert_eq!(lines, change, "{history}");
    let dir = tempfile::tempdir().unwrap();
    let table =
        "[keys.\"scan-*\"]\nmax_items = 10\nmax_groups = 500\noverflow = \"flush_oldest\"\n";
    let path = file(&dir, "scan.toml", table);
    let same = policy(addr, &["diff", &path, "--exit-code"]).await;
    assert!(same.starts_with("no differences"), "{same}");

    let unset = policy(addr, &["set", "scan-*", "--unset", "overflow"]).await;
    assert_eq!(row(&unset, "overflow"), None, "{unset}");
    assert_eq!(row(&unset, "max_groups"), Some("500"), "{unset}");
    let bad = at(
        addr,
        &["policy", "set", "scan-*", "--overflow", "sometimes"],
    )
    .await;
    let stderr = failed(&bad, 2);
    assert!(
        stderr.contains("[possible values: refuse, flush_oldest]"),
        "{stderr}"
    );
    service.stop().await;
}

/// A `set` with the etag `get` printed succeeds once; again with the same
/// (now stale) etag it fails with ABORTED, exit 1, and writes nothing.
#[tokio::test]
async fn a_stale_etag_is_refused() {
    let (_redis, service) = store("[keys.\"north\"]\nmax_items = 10\n").await;
    let addr = service.addr;
    let read = policy_json(addr, &["get", "north"]).await;
    let etag = read["etag"].as_str().unwrap();
    let first = ["set", "north", "--max-items", "20", "--etag", etag];
    policy(addr, &first).await;
    let stale = [
        "policy",
        "set",
        "north",
        "--max-items",
        "30",
        "--etag",
        etag,
    ];
    let stderr = failed(&at(addr, &stale).await, 1);
    assert!(stderr.starts_with("batcher: ABORTED: "), "{stderr}");
    let now = policy_json(addr, &["get", "north"]).await;
    assert_eq!(now["maxItems"], 20);
    let deleted = at(addr, &["policy", "delete", "north", "--etag", etag]).await;
    assert!(failed(&deleted, 1).contains("ABORTED"));
    service.stop().await;
}

/// `list` shows the defaults, then each pattern with the fields it sets
/// (by prefix, as JSON lines, page by page); `delete` removes one, and
/// `get` of it then fails NOT_FOUND.
#[tokio::test]
async fn list_and_delete() {
    let seed = "[keys.\"north-*\"]\nmax_items = 10\n[keys.\"south\"]\nmax_wait = \"1m\"\n";
    let (_redis, service) = store(seed).await;
    let addr = service.addr;
    let table = policy(addr, &["list"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME "), "{table}");
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let expected = [
        "policies/defaults",
        "policies/keys/north-*",
        "policies/keys/south",
    ];
    assert_eq!(names, expected, "{table}");
    assert!(lines[2].ends_with("  max_items=10"), "{table}");
    assert!(lines[3].ends_with("  max_wait=1m"), "{table}");

    let south = json_lines(&policy(addr, &["list", "--prefix", "s", "--json"]).await);
    assert_eq!(south.len(), 1, "{south:?}");
    assert_eq!(south[0]["maxWait"], "60s");
    let paged = policy(addr, &["list", "--json", "--page-size", "1", "--all"]).await;
    assert_eq!(json_lines(&paged).len(), 3, "{paged}");

    let deleted = policy(addr, &["delete", "south", "--reason", "gone"]).await;
    assert!(
        deleted.starts_with("deleted policies/keys/south (revision "),
        "{deleted}"
    );
    let gone = failed(&at(addr, &["policy", "get", "south"]).await, 1);
    assert!(gone.contains("NOT_FOUND"), "{gone}");
    let table = policy(addr, &["list"]).await;
    assert!(!table.contains("south"), "{table}");
    service.stop().await;
}

/// `history` lists revisions newest first with who made each, why, and
/// each field's old and new value; with a name, only that policy's.
#[tokio::test]
async fn history_says_who_changed_what_and_why() {
    let (_redis, service) = store("[keys.\"north\"]\nmax_items = 10\n").await;
    let addr = service.addr;
    let raise = ["set", "north", "--max-items", "40", "--max-wait", "2h"];
    policy(addr, &[&raise[..], &["--reason", "peak season"]].concat()).await;
    policy(addr, &["set", "south", "--max-items", "5"]).await;

    let text = policy(addr, &["history", "north"]).await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("revision 2  "), "{text}");
    assert!(lines[0].contains("  peer 127.0.0.1:"), "{text}");
    assert!(lines[0].ends_with("  reason: peak season"), "{text}");
    let change = [
        "  UPDATED policies/keys/north",
        "    max_items: 10 -> 40",
        "    max_wait: null -> \"2h\"",
    ];
    assert_eq!(lines[1..4], change, "{text}");
    assert!(lines[4].starts_with("revision 1  "), "the seed: {text}");
    assert!(!text.contains("south"), "{text}");

    let all = json_lines(&policy(addr, &["history", "--json"]).await);
    let revisions: Vec<&str> = all
        .iter()
        .map(|r| r["revision"].as_str().unwrap())
        .collect();
    assert_eq!(revisions, ["3", "2", "1"]);
    assert_eq!(all[0]["changes"][0]["action"], "CREATED");
    service.stop().await;
}

/// A config file named `name` in a temporary directory.
fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path: PathBuf = dir.path().join(name);
    std::fs::write(&path, text).expect("write the file");
    path.to_str().unwrap().to_owned()
}

/// `diff --exit-code` shows what an import would change and exits 1; the
/// import writes it all as one revision; then `diff` finds no difference
/// and exits 0. `--prune` deletes the patterns the file lacks, likewise.
#[tokio::test]
async fn diff_then_import_as_one_revision() {
    let seed = "[keys.\"north\"]\nmax_items = 10\n[keys.\"old\"]\nmax_items = 3\n";
    let (_redis, service) = store(seed).await;
    let addr = service.addr;
    let dir = tempfile::tempdir().unwrap();
    let text = "[defaults]\nmax_items = 20\n[keys.\"north\"]\nmax_items = 30\n\
                [keys.\"south-*\"]\nmax_wait = \"90s\"\n";
    let path = file(&dir, "policies.toml", text);

    let before = at(addr, &["policy", "diff", &path, "--exit-code"]).await;
    failed(&before, 1);
    let shown = String::from_utf8_lossy(&before.stdout);
    for expected in [
        "UPDATED policies/defaults\n  max_items: 10 -> 20\n",
        "UPDATED policies/keys/north\n  max_items: 10 -> 30\n",
        "CREATED policies/keys/south-*\n  max_wait: null -> \"1m 30s\"\n",
        "3 policies differ from the store at revision 1: 1 created, 2 updated, 0 deleted",
    ] {
        assert!(shown.contains(expected), "{expected:?} in {shown}");
    }
    assert!(!shown.contains("old"), "kept without --prune: {shown}");

    let done = policy(addr, &["import", &path]).await;
    assert_eq!(
        done.trim(),
        format!("imported {path} as revision 2: 1 created, 2 changed, 0 deleted")
    );
    let history = json_lines(&policy(addr, &["history", "--json"]).await);
    assert_eq!(history.len(), 2, "the seed and one import: {history:?}");
    assert_eq!(history[0]["changes"].as_array().unwrap().len(), 3);
    assert_eq!(
        history[0]["reason"],
        format!("batcher policy import {path}")
    );
    let after = policy(addr, &["diff", &path, "--exit-code"]).await;
    assert_eq!(after.trim(), "no differences (store at revision 2)");

    let pruning = at(addr, &["policy", "diff", &path, "--prune", "--exit-code"]).await;
    failed(&pruning, 1);
    let shown = String::from_utf8_lossy(&pruning.stdout);
    assert!(
        shown.starts_with("DELETED policies/keys/old\n  max_items: 3 -> null\n"),
        "{shown}"
    );
    let pruned = policy(addr, &["import", &path, "--prune", "--reason", "tidy"]).await;
    assert!(
        pruned.ends_with("as revision 3: 0 created, 0 changed, 1 deleted\n"),
        "{pruned}"
    );
    policy(addr, &["diff", &path, "--prune", "--exit-code"]).await;
    let again = policy(addr, &["import", &path, "--prune"]).await;
    assert!(again.starts_with("no changes: "), "{again}");
    service.stop().await;
}
