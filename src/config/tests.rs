//! Tests of the file format end to end: text in, a `Config`, its `Policies`,
//! or a one-line error out.

use super::*;

mod policy;

const EXAMPLE: &str = r#"
listen = "127.0.0.1:50051"

[redis]
url = "redis://127.0.0.1:6379"   # omit to run the embedded redis-server
prefix = "batcher"
shards = 16

[defaults]
max_items = 10                   # flush when a group reaches this many items
max_wait = "4m"                  # flush when the first item has waited this long
# max_bytes = "1MiB"             # optional: flush when the payload bytes reach this

[keys."north"]                   # an exact key
max_items = 25
max_wait = "2m"

[keys."south-*"]                 # a glob: '*' matches any run of characters
max_wait = "30s"
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "batcher.toml")
}

fn err(text: &str) -> String {
    parse(text)
        .expect_err("config should be rejected")
        .to_string()
}

fn policy(max_items: u32, max_wait: &str, max_bytes: Option<u64>) -> Policy {
    Policy::basic(
        max_items,
        humantime::parse_duration(max_wait).unwrap(),
        max_bytes,
    )
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// The documented example parses to the values it spells out.
#[test]
fn example_parses() {
    let c = parse(EXAMPLE).unwrap();
    assert_eq!(c.listen, "127.0.0.1:50051".parse::<SocketAddr>().unwrap());
    assert_eq!(c.redis.url.as_deref(), Some("redis://127.0.0.1:6379"));
    assert_eq!(c.redis.prefix, "batcher");
    assert_eq!(c.redis.shards.get(), 16);
    assert_eq!(c.defaults.max_items, nz(10));
    assert_eq!(c.defaults.max_wait, Duration::from_secs(240));
    assert_eq!(c.defaults.max_bytes, None);
    assert_eq!(c.keys.len(), 2);
    assert_eq!(c.keys["north"].max_items, Some(nz(25)));
    assert_eq!(c.keys["north"].max_wait, Some(Duration::from_secs(120)));
    assert_eq!(c.keys["south-*"].max_items, None);
    assert_eq!(c.keys["south-*"].max_wait, Some(Duration::from_secs(30)));
    let p = c.policies();
    assert_eq!(p.resolve("north"), policy(25, "2m", None));
    assert_eq!(p.matching_pattern("north"), Some("north"));
    assert_eq!(p.resolve("south-1"), policy(10, "30s", None));
    assert_eq!(p.matching_pattern("south-1"), Some("south-*"));
    assert_eq!(p.resolve("east"), policy(10, "4m", None));
    // Everything not in the file is at its default.
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.drain_delay, DEFAULT_DRAIN_DELAY);
    assert_eq!(c.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
    assert_eq!(c.worker_threads, None);
}

/// Unset, `worker_threads` is one on a single Redis and one per core on a
/// cluster; set, it is what the file says, on either.
#[test]
fn worker_threads_follow_the_redis_unless_set() {
    let threads = |text: &str| parse(text).unwrap().worker_threads().get();
    let cores = std::thread::available_parallelism().unwrap().get();
    let cluster = "[redis]\ncluster_nodes = [\"redis://127.0.0.1:7000\"]\n";
    assert_eq!(threads(""), 1);
    assert_eq!(threads("[redis]\nurl = \"redis://127.0.0.1:6379\"\n"), 1);
    assert_eq!(threads(cluster), cores);
    assert_eq!(threads("worker_threads = 3\n"), 3);
    assert_eq!(threads(&format!("worker_threads = 3\n{cluster}")), 3);
}

/// The config block of docs/configuration.md parses, and spells out every
/// default.
#[test]
fn documented_config_is_the_defaults() {
    let page = include_str!("../../docs/configuration.md");
    let start = page
        .find("## Every field, at its default")
        .expect("the section of every field");
    let block = page[start..]
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml block in the config section");
    let c = parse(block).unwrap();
    let want = Config {
        keys: parse(EXAMPLE).unwrap().keys,
        ..Config::default()
    };
    assert_eq!(c, want);
}

/// An empty file is exactly `Config::default()`, with the documented values.
#[test]
fn empty_is_default() {
    let c = parse("").unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(c.redis.url, None);
    assert_eq!(c.redis.appendfsync, AppendFsync::Always);
    assert_eq!(c.redis.appendfsync.to_string(), "always");
    assert_eq!(c.redis.redis_server, PathBuf::from("redis-server"));
    assert_eq!(c.redis.connect_timeout, Duration::from_secs(1));
    assert_eq!(c.redis.response_timeout, Duration::from_secs(2));
    assert_eq!(c.limits.max_payload_bytes.as_u64(), 65536);
    assert_eq!(c.dedup.window, Duration::from_secs(600));
    assert_eq!(c.sweeper.max_sleep, Duration::from_millis(250));
    assert_eq!(c.subscriptions.retention, Duration::from_secs(86400));
    assert_eq!(c.policies().defaults(), Policy::default());
    // Empty tables are no different from missing ones.
    let tables = "[redis]\n[defaults]\n[keys]\n[limits]\n[dedup]\n[sweeper]\n[subscriptions]\n";
    assert_eq!(parse(tables).unwrap(), Config::default());
    Config::default().validate().unwrap();
}

/// Every optional table and field is read from the file when present.
#[test]
fn all_fields_parse() {
    let c = parse(
        r#"
drain_delay = "2s"
drain_timeout = "3s"
[redis]
redis_server = "/opt/redis/bin/redis-server"
appendfsync = "everysec"
connect_timeout = "500ms"
response_timeout = "5s"
[defaults]
max_bytes = "1MiB"
[limits]
max_key_bytes = 128
max_item_id_bytes = "1KiB"
max_payload_bytes = "64KiB"
max_items = 500
max_add_many = 50
max_open_groups = 5000
[dedup]
window = "1h 30m"
[sweeper]
max_sleep = "1s"
batch = 8
[subscriptions]
retention = "2h"
buffer = 16
ack_timeout = "1m"
max_deliveries = 3
trim_every = "10s"
"#,
    )
    .unwrap();
    assert_eq!(c.drain_delay, Duration::from_secs(2));
    assert_eq!(c.drain_timeout, Duration::from_secs(3));
    assert_eq!(
        c.redis.redis_server,
        PathBuf::from("/opt/redis/bin/redis-server")
    );
    assert_eq!(c.redis.appendfsync, AppendFsync::Everysec);
    assert_eq!(c.redis.connect_timeout, Duration::from_millis(500));
    assert_eq!(c.redis.response_timeout, Duration::from_secs(5));
    assert_eq!(c.defaults.max_bytes, Some(ByteSize::mib(1)));
    assert_eq!(
        c.limits,
        Limits {
            max_key_bytes: ByteSize::b(128),
            max_item_id_bytes: ByteSize::b(1024),
            max_payload_bytes: ByteSize::b(65536),
            max_items: nz(500),
            max_add_many: NonZeroUsize::new(50).unwrap(),
            max_open_groups: 5000,
            ..Limits::default()
        }
    );
    assert_eq!(c.dedup.window, Duration::from_secs(5400));
    assert_eq!(c.sweeper.max_sleep, Duration::from_secs(1));
    assert_eq!(c.sweeper.batch.get(), 8);
    let s = c.subscriptions;
    assert_eq!(s.retention, Duration::from_secs(7200));
    assert_eq!(s.buffer.get(), 16);
    assert_eq!(s.ack_timeout, Duration::from_secs(60));
    assert_eq!(s.max_deliveries.get(), 3);
    assert_eq!(s.trim_every, Duration::from_secs(10));
}

/// `appendfsync` takes exactly Redis' three policies, by their Redis names.
#[test]
fn appendfsync_values() {
    for (text, want) in [
        ("always", AppendFsync::Always),
        ("everysec", AppendFsync::Everysec),
        ("no", AppendFsync::No),
    ] {
        let c = parse(&format!("[redis]\nappendfsync = \"{text}\"\n")).unwrap();
        assert_eq!(c.redis.appendfsync, want);
        assert_eq!(want.as_str(), text);
        assert_eq!(want.to_string(), text);
    }
    let msg = err("[redis]\nappendfsync = \"sometimes\"\n");
    assert!(
        msg.starts_with(
            "batcher.toml: [redis] appendfsync: unknown variant `sometimes`, \
             expected one of `always`, `everysec`, `no` (line 2"
        ),
        "{msg}"
    );
    assert!(err("[redis]\nappendfsync = \"Always\"\n").contains("unknown variant"));
}

/// Fields a matching table leaves unset come from [defaults], not from a losing glob.
#[test]
fn unset_fields_come_from_defaults() {
    let c = parse(
        r#"
[defaults]
max_items = 11
max_wait = "1m"
max_bytes = "10KB"
[keys."a*"]
max_items = 3
max_wait = "5s"
max_bytes = 99
[keys."ab*"]
max_wait = "7s"
"#,
    )
    .unwrap();
    let p = c.policies();
    assert_eq!(p.resolve("abc"), policy(11, "7s", Some(10_000)));
    assert_eq!(p.resolve("axe"), policy(3, "5s", Some(99)));
    assert_eq!(p.resolve("zzz"), policy(11, "1m", Some(10_000)));
    assert_eq!(p.defaults(), policy(11, "1m", Some(10_000)));
}

/// An unknown field's error names the file, the table and the field.
#[test]
fn unknown_field_names_file_table_field() {
    let e = parse("[keys.\"north\"]\nmax_itemz = 3\n").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("batcher.toml: [keys.\"north\"] unknown field `max_itemz`"),
        "{msg}"
    );
    assert!(msg.contains("line 2"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    match e {
        ConfigError::UnknownField { table, field, .. } => {
            assert_eq!(table, "keys.\"north\"");
            assert_eq!(field, "max_itemz");
        }
        other => panic!("wrong variant: {other:?}"),
    }
    for (text, want) in [
        ("[redis]\nshard = 3\n", "[redis] unknown field `shard`"),
        (
            "lisen = \"1.2.3.4:5\"\n",
            "[top level] unknown field `lisen`",
        ),
        ("[dedupe]\n", "[top level] unknown field `dedupe`"),
    ] {
        let msg = err(text);
        assert!(msg.starts_with(&format!("batcher.toml: {want}")), "{msg}");
    }
}

/// `max_items` of 0 is refused by its type, and one above `[limits]` by
/// validation; both name the file, table, field and line.
#[test]
fn max_items_names_file_table_field_line() {
    let msg = err("[keys.\"north\"]\nmax_items = 0\n");
    assert_eq!(
        msg,
        "batcher.toml: [keys.\"north\"] max_items: invalid value: integer `0`, \
         expected a nonzero u32 (line 2, column 13)"
    );
    let msg = err("[defaults]\nmax_items = 0\n");
    assert!(
        msg.starts_with("batcher.toml: [defaults] max_items: invalid value: integer `0`"),
        "{msg}"
    );
    // The bound follows [limits].
    let e = parse("[limits]\nmax_items = 20\n[keys.\"x*\"]\nmax_items = 21\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "batcher.toml: [keys.\"x*\"] max_items: must be between 1 and 20 \
         (limits.max_items), got 21 (line 4, column 1)"
    );
    match e {
        ConfigError::Invalid {
            table,
            field,
            location,
            ..
        } => {
            assert_eq!(table, "keys.\"x*\"");
            assert_eq!(field, "max_items");
            assert_eq!(location, Some((4, 1)));
        }
        other => panic!("wrong variant: {other:?}"),
    }
    // A default that [limits] makes too large points at [defaults], which
    // the file does not write, so it has no line.
    let msg = err("[limits]\nmax_items = 5\n");
    assert_eq!(
        msg,
        "batcher.toml: [defaults] max_items: must be between 1 and 5 \
         (limits.max_items), got 10"
    );
    // A field left at its default points at its table's header.
    let msg = err("[limits]\nmax_items = 5\n\n[defaults]\nmax_wait = \"1m\"\n");
    assert!(msg.ends_with("got 10 (line 4, column 2)"), "{msg}");
}

/// A bad duration names the table and field and quotes the bad value.
#[test]
fn bad_duration() {
    for (text, want) in [
        (
            "[defaults]\nmax_wait = \"4 parsecs\"\n",
            "batcher.toml: [defaults] max_wait: invalid value: string \"4 parsecs\", \
             expected a duration (line 2",
        ),
        (
            "[sweeper]\nmax_sleep = 5\n",
            "batcher.toml: [sweeper] max_sleep: invalid type",
        ),
        (
            "[keys.\"a\"]\nmax_wait = \"0s\"\n",
            "batcher.toml: [keys.\"a\"] max_wait: must be greater than 0",
        ),
        (
            "[defaults]\nmax_wait = \"31days\"\n",
            "batcher.toml: [defaults] max_wait: must be greater than 0 and at most 30days",
        ),
        (
            "drain_delay = \"soon\"\n",
            "batcher.toml: [top level] drain_delay: invalid value: string \"soon\"",
        ),
    ] {
        let msg = err(text);
        assert!(
            msg.starts_with(want),
            "{text:?}: got {msg:?}, want {want:?}"
        );
        assert!(!msg.contains('\n'), "{msg}");
    }
}

/// `shutdown_grace`, the former name of `drain_timeout`, is still read as
/// it, and a file may not give both.
#[test]
fn shutdown_grace_is_drain_timeout() {
    let c = parse("shutdown_grace = \"7s\"\n").unwrap();
    assert_eq!(c.drain_timeout, Duration::from_secs(7));
    let msg = err("shutdown_grace = \"1s\"\ndrain_timeout = \"2s\"\n");
    assert!(msg.contains("duplicate field `drain_timeout`"), "{msg}");
}

/// Byte sizes accept integers and the documented unit strings.
#[test]
fn size_strings_parse() {
    for (text, bytes) in [
        ("1024", 1024),
        ("\"1024\"", 1024),
        ("\"512B\"", 512),
        ("\"64KiB\"", 65536),
        ("\"1MiB\"", 1 << 20),
        ("\"1GiB\"", 1 << 30),
        ("\"10KB\"", 10_000),
        ("\"1MB\"", 1_000_000),
        ("\"2 kib\"", 2048),
        ("\"1.5KiB\"", 1536),
    ] {
        let c = parse(&format!("[keys.\"k\"]\nmax_bytes = {text}\n"))
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(c.keys["k"].max_bytes, Some(ByteSize::b(bytes)), "{text}");
    }
    for bad in [
        "\"\"",
        "\"MiB\"",
        "\"-1\"",
        "\"10 parsecs\"",
        "\"99999999999999999999\"",
        "-5",
        "1.5",
    ] {
        let msg = err(&format!("[defaults]\nmax_bytes = {bad}\n"));
        assert!(
            msg.starts_with("batcher.toml: [defaults] max_bytes: "),
            "{bad}: {msg}"
        );
        assert!(msg.contains("(line 2, column 13)"), "{bad}: {msg}");
    }
    let c =
        parse("[defaults]\nmax_bytes = \"1MiB\"\n[limits]\nmax_payload_bytes = 4096\n").unwrap();
    assert_eq!(c.defaults.policy().max_bytes, Some(1 << 20));
    assert_eq!(c.limits.max_payload_bytes.as_u64(), 4096);
    let msg = err("[limits]\nmax_payload_bytes = \"64 furlongs\"\n");
    assert!(
        msg.starts_with(
            "batcher.toml: [limits] max_payload_bytes: invalid value: string \"64 furlongs\""
        ),
        "{msg}"
    );
    let msg = err("[limits]\nmax_payload_bytes = \"1GiB\"\n");
    assert!(
        msg.contains("[limits] max_payload_bytes: must be between 1 and 536870912"),
        "{msg}"
    );
    let msg = err("[defaults]\nmax_bytes = 0\n");
    assert!(
        msg.contains("[defaults] max_bytes: must be at least 1 when set, got 0 (line 2"),
        "{msg}"
    );
}

/// Asserts that each text is rejected with a one-line message that holds
/// its `want` and a line number.
fn assert_rejected(cases: &[(impl AsRef<str>, impl AsRef<str>)]) {
    for (text, want) in cases {
        let (text, want) = (text.as_ref(), want.as_ref());
        let msg = err(text);
        assert!(msg.contains(want), "{text:?}: got {msg:?}, want {want:?}");
        assert!(msg.contains("(line "), "{text:?}: no line in {msg:?}");
        assert!(!msg.contains('\n'), "{msg}");
    }
}

/// Values their type refuses (a zero count, a string for a number, a host
/// name for an address) name the table, the field and the line.
#[test]
fn type_errors_name_table_field_line() {
    assert_rejected(&[
        (
            "listen = \"localhost\"\n",
            "batcher.toml: [top level] listen: invalid socket address syntax",
        ),
        (
            "worker_threads = 0\n",
            "batcher.toml: [top level] worker_threads: invalid value: integer `0`, expected a nonzero usize",
        ),
        (
            "[redis]\nshards = 0\n",
            "batcher.toml: [redis] shards: invalid value: integer `0`, expected a nonzero u16",
        ),
        (
            "[limits]\nmax_add_many = 0\n",
            "[limits] max_add_many: invalid value: integer `0`, expected a nonzero usize",
        ),
        (
            "[limits]\nmax_items = 0\n",
            "[limits] max_items: invalid value: integer `0`, expected a nonzero u32",
        ),
        (
            "[sweeper]\nbatch = 0\n",
            "[sweeper] batch: invalid value: integer `0`, expected a nonzero usize",
        ),
        (
            "[subscriptions]\nbuffer = 0\n",
            "[subscriptions] buffer: invalid value: integer `0`, expected a nonzero usize",
        ),
        (
            "[subscriptions]\nmax_deliveries = 0\n",
            "[subscriptions] max_deliveries: invalid value: integer `0`",
        ),
        (
            "[redis]\nshards = \"many\"\n",
            "batcher.toml: [redis] shards: invalid type: string \"many\"",
        ),
        (
            "[redis]\nshards = -1\n",
            "batcher.toml: [redis] shards: invalid value",
        ),
        (
            "redis = 5\n",
            "batcher.toml: [top level] redis: invalid type",
        ),
        (
            "[keys]\nnorth = 5\n",
            "batcher.toml: [keys] \"north\": invalid type",
        ),
    ]);
}

/// Values that break a rule of `validate` name the table, the field and the line.
#[test]
fn rule_errors_name_table_field_line() {
    assert_rejected(&[
        (
            "worker_threads = 257\n",
            "batcher.toml: [top level] worker_threads: must be from 1 to 256, got 257 (line 1, column 1)",
        ),
        (
            "[redis]\nshards = 1025\n",
            "batcher.toml: [redis] shards: must be between 1 and 1024, got 1025 (line 2, column 1)",
        ),
        (
            "[redis]\nprefix = \"\"\n",
            "batcher.toml: [redis] prefix: must be non-empty",
        ),
        (
            "[redis]\nprefix = \"a{b\"\n",
            "[redis] prefix: must be non-empty and contain no",
        ),
        (
            "[redis]\nprefix = \"a b\"\n",
            "[redis] prefix: must be non-empty and contain no",
        ),
        (
            "[redis]\nurl = \"localhost:6379\"\n",
            "[redis] url: must start with redis://",
        ),
        (
            "[redis]\ndata_dir = \"\"\n",
            "[redis] data_dir: must not be empty (line 2",
        ),
        (
            "[redis]\nredis_server = \"\"\n",
            "[redis] redis_server: must not be empty (line 2",
        ),
        (
            "[redis]\nconnect_timeout = \"0s\"\n",
            "[redis] connect_timeout: must be greater than 0 (line 2",
        ),
        (
            "[limits]\nmax_key_bytes = 0\n",
            "[limits] max_key_bytes: must be between 1 and 65536, got 0",
        ),
        (
            "[limits]\nmax_item_id_bytes = 65537\n",
            "[limits] max_item_id_bytes: must be between 1 and 65536",
        ),
        (
            "[keys.\"\"]\n",
            "batcher.toml: [keys] \"\": a key pattern must not be empty (line 1, column 7)",
        ),
        (
            "[limits]\nmax_key_bytes = 3\n[keys.\"abcd*\"]\n",
            "[keys] \"abcd*\": can never match",
        ),
        (
            "[dedup]\nwindow = \"0s\"\n",
            "[dedup] window: must be greater than 0",
        ),
        (
            "[sweeper]\nmax_sleep = \"0s\"\n",
            "[sweeper] max_sleep: must be greater than 0",
        ),
        (
            "[subscriptions]\nack_timeout = \"0s\"\n",
            "[subscriptions] ack_timeout: must be greater than 0",
        ),
        (
            "[subscriptions]\ntrim_every = \"0s\"\n",
            "[subscriptions] trim_every: must be greater than 0",
        ),
    ]);
}

/// A TOML syntax error names the file and the line, on one line.
#[test]
fn syntax_error() {
    let e = parse("[defaults]\nmax_items = = 3\n").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("batcher.toml: TOML syntax error at line 2"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
}

/// `load` reads a file, and names it when it cannot.
#[test]
fn load_reads_file() {
    let dir = std::env::temp_dir().join(format!("batcher-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("batcher.toml");
    std::fs::write(&path, EXAMPLE).unwrap();
    assert_eq!(Config::load(&path).unwrap(), parse(EXAMPLE).unwrap());
    std::fs::write(&path, "[defaults]\nmax_items = 0\n").unwrap();
    let msg = Config::load(&path).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: [defaults] max_items", path.display())),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = dir.join("missing.toml");
    let msg = Config::load(&missing).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: cannot read config file", missing.display())),
        "{msg}"
    );
}
