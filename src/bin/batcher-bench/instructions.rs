//! `batcher-bench instructions`: the Redis instructions each added item
//! costs, counted by callgrind, as a yardstick that neither the machine nor
//! its load can move.
//!
//! Each shape gets a fresh `redis-server` (Debian's; the library's launcher
//! on a free loopback port, a temporary dir, no persistence) run under
//! `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect=processInputBuffer`: only the instructions executed
//! while Redis parses and runs a client's commands are counted (RESP
//! parsing, the script, every command it calls, replies into the client's
//! buffer), never the event loop, `serverCron`, socket writes or startup.
//! (Debian's redis-server is stripped but keeps its dynamic symbols, which
//! is all callgrind needs. `--toggle-collect=call` would work too, but
//! would leave out the parsing of our argument lists, 5% of `addmany`.)
//! Three settings keep timing out of the count: `activerehashing no` (no
//! timer-driven rehash changes what the commands find), and no slowlog or
//! latency histograms (under callgrind some calls take over slowlog's
//! 10 ms and some not; in production an add logs neither). After a warm-up
//! add (so the scripts are loaded) and a `FLUSHALL`, `callgrind_control -d`
//! dumps and so zeroes the counts; the shape runs; a second dump's
//! `totals:` is the shape's count. Everything else about it is fixed: the
//! item sequence is seeded, calls are issued one at a time (each awaited),
//! and the keyspace has one shard, so a `Store::add` of 100 items is one
//! script call.
//!
//! What is left is Redis's own per-start randomness: its dict hash seed
//! (so the chains its command table lookups walk) and its skiplist levels.
//! Ours repeat within about 0.1% across runs, loaded machine or not; a
//! floor shape, which does far less per command, moves up to 0.8% from one
//! start to the next, so it runs on three and reports their median.
//!
//! Shapes, each through the public [`Store`] API (so the harness survives
//! changes of the scripts behind it), over [`KEYS`] keys drawn by a seeded
//! xorshift, 15-byte keys, 25-byte ids and 32-byte payloads as in the other
//! scenarios:
//! - `addmany`: [`ITEMS`] items in calls of 100, policy max_items 10,
//!   max_wait 1 h (groups flush by SIZE, as in production);
//! - `unary`: the first [`UNARY_ITEMS`] of the same items, one per call;
//! - `every_rule`: as `addmany`, under scenario 11's policy with every rule
//!   on ([`RULES_CONFIG`], parsed by the service's own config code) and its
//!   parcels: a weight and a volume on every item, a deadline 10 to 40
//!   minutes ahead on one in ten;
//! - `floor_addmany`, `floor_unary`: the same items as `addmany` and
//!   `unary`, through `bench/floor/floor.lua` with EVALSHA on a plain
//!   connection: the least an add script can do (HSETNX and HLEN per item,
//!   ZADD when a group opens, HGETALL, XADD, DEL and ZREM when it fills).
//!   That file is frozen, so the ratios to it compare with earlier runs.
//!
//! Each runs on a Redis of its own, [`PARALLEL`] at a time; the whole mode
//! takes about a minute of CPU (valgrind runs Redis some fifty times
//! slower), so some 30 to 40 s on two idle cores. The sizes are fixed
//! constants, small for that reason (halving them moved the per-item
//! figures by about 1%).
//!
//! The figure is instructions per item (and per call). The floor shapes are
//! printed but never checked. `--write PATH` writes the figures as a
//! baseline (`bench/instructions.toml`); `--check PATH` compares with one
//! and exits 1 when a checked shape rose more than [`MAX_RISE`] above it.
//! Without either, the table compares with `bench/instructions.toml` when
//! it exists, and the exit status is 0. Instruction counts depend on the
//! Redis build, not on the host, its load or our build profile: the
//! baseline records the Redis version it was made with, and a check against
//! another says so.
//!
//! ```sh
//! scripts/ensure-redis && scripts/ensure-valgrind
//! cargo run --bin batcher-bench -- instructions                     # the table
//! cargo run --bin batcher-bench -- instructions --check bench/instructions.toml
//! cargo run --bin batcher-bench -- instructions --write bench/instructions.toml
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use batcher::batch::Item;
use batcher::config::Config;
use batcher::embedded::launcher::{self, Launch, LaunchError};
use batcher::keys::Keyspace;
use batcher::policy::{Policy, PolicyHandle};
use batcher::store::{AddOutcome, NewItem, RedisTarget, Store, Timeouts};
use redis::aio::MultiplexedConnection;

use super::load::{self, PAYLOAD, Rng};
use super::policies::{DEADLINE_AHEAD_S, DEADLINE_ONE_IN, RULES_CONFIG, VOLUME_CM3, WEIGHT_G};

/// Items of `addmany`, `every_rule` and `floor_addmany`.
pub const ITEMS: usize = 10_000;
/// Items (and calls) of `unary` and `floor_unary`.
pub const UNARY_ITEMS: usize = 1_500;
/// Items per call of the many-item shapes.
pub const PER_CALL: usize = 100;
/// Distinct group keys the items are drawn over.
pub const KEYS: u64 = 1_000;
/// Seed of the key draws (the parcels' draws use the next one).
pub const SEED: u64 = 0x1157_2024;
/// How far a checked shape may rise above its baseline: 3%.
pub const MAX_RISE: f64 = 0.03;
/// The issue's target for `every_rule / addmany`.
pub const MAX_RULES_RATIO: f64 = 1.25;
/// Redis servers each floor shape runs on (see [`Shape::starts`]).
const FLOOR_STARTS: usize = 3;
/// Shapes run at once, each on its own Redis (callgrind keeps a process on
/// one core, and each waits on its client between calls).
const PARALLEL: usize = 3;
/// The function callgrind counts inside (see the module docs).
const TOGGLE: &str = "processInputBuffer";
/// The baseline the table compares with when neither --check nor --write is given.
const DEFAULT_BASELINE: &str = "bench/instructions.toml";

/// The frozen floor: see its header.
static FLOOR: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../bench/floor/floor.lua")));

/// The options of `batcher-bench instructions`.
#[derive(clap::Args)]
pub struct Opts {
    /// Write the figures to this baseline file (bench/instructions.toml).
    #[arg(long, value_name = "PATH", conflicts_with = "check")]
    write: Option<PathBuf>,
    /// Compare with this baseline and exit 1 if a shape of ours (not the
    /// floor's) rose more than 3% above it.
    #[arg(long, value_name = "PATH")]
    check: Option<PathBuf>,
}

/// Which add path a shape runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `Store::add`, with every rule on or with the plain policy.
    Store { rules: bool },
    /// `bench/floor/floor.lua` by EVALSHA.
    Floor,
}

/// One shape of the workload.
struct Shape {
    name: &'static str,
    route: Route,
    items: usize,
    per_call: usize,
}

impl Shape {
    /// Whether --check holds it to its baseline (the floor's are not ours).
    fn checked(&self) -> bool {
        self.route != Route::Floor
    }

    /// On how many fresh Redis servers it runs: the figure is their median.
    /// Redis seeds its dict hashes (so the chains its command table
    /// lookups walk) and its skiplist levels anew at each start, which moves
    /// a shape by a roughly fixed number of instructions per command: about
    /// 0.1% of ours, but up to 0.8% of the floor's, which does much less per
    /// command.
    fn starts(&self) -> usize {
        if self.checked() { 1 } else { FLOOR_STARTS }
    }
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "addmany",
        route: Route::Store { rules: false },
        items: ITEMS,
        per_call: PER_CALL,
    },
    Shape {
        name: "unary",
        route: Route::Store { rules: false },
        items: UNARY_ITEMS,
        per_call: 1,
    },
    Shape {
        name: "every_rule",
        route: Route::Store { rules: true },
        items: ITEMS,
        per_call: PER_CALL,
    },
    Shape {
        name: "floor_addmany",
        route: Route::Floor,
        items: ITEMS,
        per_call: PER_CALL,
    },
    Shape {
        name: "floor_unary",
        route: Route::Floor,
        items: UNARY_ITEMS,
        per_call: 1,
    },
];

/// One item of the sequence, before it is shaped for a path.
struct Draw {
    /// Which of the [`KEYS`] keys.
    key: u64,
    id: String,
    weight_g: u64,
    volume_cm3: u64,
    /// Seconds ahead, for the one in [`DEADLINE_ONE_IN`] that has a deadline.
    deadline_s: Option<u64>,
}

/// The first `n` items of the seeded sequence: the same keys and ids for
/// every shape, and parcels drawn from a stream of their own, so turning the
/// rules on changes nothing else.
fn sequence(n: usize) -> Vec<Draw> {
    let mut keys = Rng::new(SEED);
    let mut parcels = Rng::new(SEED + 1);
    let mut draw =
        |range: &std::ops::Range<u64>| range.start + parcels.below(range.end - range.start);
    (0..n)
        .map(|seq| Draw {
            key: keys.below(KEYS),
            id: load::id("ins0", 0, seq as u64),
            weight_g: draw(&WEIGHT_G),
            volume_cm3: draw(&VOLUME_CM3),
            deadline_s: (draw(&(0..DEADLINE_ONE_IN)) == 0).then(|| draw(&DEADLINE_AHEAD_S)),
        })
        .collect()
}

/// The group key of draw `n`: `ib-…` under the plain policy, `pr-…` (the
/// every-rule glob) under the rules; 15 bytes either way.
fn group_key(rules: bool, n: u64) -> String {
    load::key(if rules { "pr" } else { "ib" }, "ins0", n)
}

/// The two policies, from the service's own config code: the bench's
/// defaults (max_items 10, max_wait 1 h) and scenario 11's every-rule glob.
struct Policies {
    handle: PolicyHandle,
    plain: Policy,
    rules: Policy,
    dedup: Duration,
}

fn policies() -> Result<Policies, String> {
    let text = format!("[defaults]\nmax_items = 10\nmax_wait = \"1h\"\n{RULES_CONFIG}");
    let config = Config::parse(&text, "instructions").map_err(|e| e.to_string())?;
    let table = config.policies();
    let plain = table.resolve(&group_key(false, 0));
    let rules = table.resolve(&group_key(true, 0));
    if plain == rules || rules.capacity.is_empty() {
        return Err("the every-rule glob did not resolve".into());
    }
    Ok(Policies {
        handle: PolicyHandle::new(table),
        plain,
        rules,
        dedup: config.dedup.window,
    })
}

/// What a shape measured.
struct Measured {
    name: &'static str,
    checked: bool,
    items: usize,
    calls: usize,
    /// Instructions over the whole shape.
    instructions: u64,
    /// Batches written, by reason.
    batches: BTreeMap<String, u64>,
    /// With several starts: how many, and (max − min) / median of their counts.
    spread: Option<(usize, f64)>,
}

impl Measured {
    fn per_item(&self) -> f64 {
        self.instructions as f64 / self.items as f64
    }

    fn per_call(&self) -> f64 {
        self.instructions as f64 / self.calls as f64
    }
}

/// Runs the mode; see the module docs.
pub fn main(opts: Opts) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("batcher-bench instructions: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Every redis-server is spawned from this thread (see procs.rs); Ctrl-C
    // drops the future, and with it the server.
    runtime.block_on(async {
        tokio::select! {
            code = run(opts) => code,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("batcher-bench instructions: interrupted");
                ExitCode::FAILURE
            }
        }
    })
}

async fn run(opts: Opts) -> ExitCode {
    let started = Instant::now();
    let (measured, redis) = match measure_all().await {
        Ok(done) => done,
        Err(e) => {
            eprintln!("batcher-bench instructions: {e}");
            return ExitCode::FAILURE;
        }
    };
    let baseline_path = opts.check.clone().or_else(|| {
        let default = repo_root().join(DEFAULT_BASELINE);
        (opts.write.is_none() && default.exists()).then_some(default)
    });
    let baseline = match &baseline_path {
        Some(path) => match Baseline::read(path) {
            Ok(baseline) => Some(baseline),
            Err(e) => {
                eprintln!("batcher-bench instructions: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let failures = print_table(&measured, baseline.as_ref(), &redis);
    println!("({:.0} s in all)", started.elapsed().as_secs_f64());
    if let Some(path) = &opts.write {
        match std::fs::write(path, Baseline::render(&measured, &redis)) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => {
                eprintln!(
                    "batcher-bench instructions: cannot write {}: {e}",
                    path.display()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    if opts.check.is_some() && !failures.is_empty() {
        eprintln!(
            "batcher-bench instructions: above the baseline by more than {:.0}%: {}. \
             If that is intended, regenerate the baseline (see its header) in a commit \
             that says why.",
            MAX_RISE * 100.0,
            failures.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The repository, where the default baseline lives.
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs every shape, each on fresh profiled Redis servers ([`PARALLEL`] at
/// once: the counts do not depend on timing); also returns that Redis's
/// version and build id.
async fn measure_all() -> Result<(Vec<Measured>, RedisBuild), String> {
    use futures::StreamExt;
    check_tools()?;
    let policies = policies()?;
    let jobs = SHAPES
        .iter()
        .flat_map(|shape| std::iter::repeat_n(shape, shape.starts()));
    let runs: Vec<_> = futures::stream::iter(jobs.map(|shape| measure(shape, &policies)))
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut runs = runs.into_iter();
    let mut measured = Vec::new();
    let mut build = None;
    for shape in &SHAPES {
        let mut mine = Vec::new();
        for run in runs.by_ref().take(shape.starts()) {
            let (m, b) = run?;
            build.get_or_insert(b);
            mine.push(m);
        }
        mine.sort_by_key(|m| m.instructions);
        let (low, high) = (mine[0].instructions, mine[mine.len() - 1].instructions);
        let mut median = mine.swap_remove(mine.len() / 2);
        if shape.starts() > 1 {
            let spread = (high - low) as f64 / median.instructions as f64;
            median.spread = Some((shape.starts(), spread));
        }
        measured.push(median);
    }
    Ok((measured, build.expect("at least one shape")))
}

/// One shape on a Redis of its own.
async fn measure(shape: &Shape, policies: &Policies) -> Result<(Measured, RedisBuild), String> {
    let started = Instant::now();
    let mut redis = Profiled::start().await?;
    let build = RedisBuild::of(redis.url()).await?;
    let m = match shape.route {
        Route::Store { rules } => run_store(&mut redis, shape, rules, policies).await?,
        Route::Floor => run_floor(&mut redis, shape, &policies.plain).await?,
    };
    eprintln!(
        "{:<14} {:>8.0} instructions per item ({:.1} s)",
        m.name,
        m.per_item(),
        started.elapsed().as_secs_f64()
    );
    Ok((m, build))
}

/// Fails early, with the fix, when valgrind or callgrind_control is missing.
fn check_tools() -> Result<(), String> {
    for tool in ["valgrind", "callgrind_control"] {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if found.is_err() {
            return Err(format!(
                "{tool} not found: install valgrind (scripts/ensure-valgrind; Debian: \
                 sudo apt-get install valgrind)"
            ));
        }
    }
    Ok(())
}

/// A `redis-server` under callgrind, counting only inside [`TOGGLE`];
/// killed on drop.
struct Profiled {
    /// Declared first, so it is killed before its dir is removed.
    server: launcher::RedisServer,
    /// callgrind's output file; the n-th dump is `<out>.<n>`.
    out: PathBuf,
    /// valgrind's `--vgdb-prefix`, which callgrind_control must be given too.
    vgdb_prefix: PathBuf,
    dumps: u32,
    _dir: tempfile::TempDir,
}

impl Profiled {
    async fn start() -> Result<Profiled, String> {
        let dir = tempfile::Builder::new()
            .prefix("batcher-instructions-")
            .tempdir()
            .map_err(|e| format!("creating a temporary dir: {e}"))?;
        // The launcher runs `<binary> --port … --dir … <config>`: a wrapper
        // puts valgrind in front, and execs, so the pid the launcher checks
        // (INFO's process_id) and signals is valgrind's, which is Redis's.
        let wrapper = dir.path().join("redis-server-under-callgrind");
        let script = format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --collect-atstart=no \
             --toggle-collect={TOGGLE} --vgdb-prefix=\"$BATCHER_VGDB_PREFIX\" \
             --callgrind-out-file=\"$BATCHER_CALLGRIND_OUT\" redis-server \"$@\"\n"
        );
        std::fs::write(&wrapper, script).map_err(|e| format!("writing the wrapper: {e}"))?;
        set_executable(&wrapper)?;
        let out = dir.path().join("callgrind.out");
        // vgdb's FIFOs, through which callgrind_control talks to it, go in
        // the temporary dir too: a killed valgrind leaves them behind.
        let vgdb_prefix = dir.path().join("vgdb-pipe");
        let launch = Launch::new()
            .binary(&wrapper)
            .dir(dir.path().join("redis"))
            .env("BATCHER_CALLGRIND_OUT", &out)
            .env("BATCHER_VGDB_PREFIX", &vgdb_prefix)
            .config("appendonly", "no")
            // Timing out of the count: see the module docs.
            .config("activerehashing", "no")
            .config("slowlog-log-slower-than", "-1")
            .config("latency-tracking", "no")
            .ready_timeout(Duration::from_secs(120));
        let server = match launch.start_async().await {
            Ok(server) => server,
            Err(LaunchError::NotInstalled { .. }) => {
                return Err("cannot run the callgrind wrapper".into());
            }
            Err(e) => {
                return Err(format!(
                    "redis-server under callgrind did not start (scripts/ensure-redis \
                     installs redis-server, scripts/ensure-valgrind valgrind): {e}"
                ));
            }
        };
        Ok(Profiled {
            server,
            out,
            vgdb_prefix,
            dumps: 0,
            _dir: dir,
        })
    }

    fn url(&self) -> &str {
        self.server.url()
    }

    /// Dumps callgrind's counts, which zeroes them, and returns the
    /// instructions counted since the previous dump (or the start).
    async fn dump(&mut self) -> Result<u64, String> {
        let pid = self.server.pid().ok_or("redis-server has exited")?;
        let output = tokio::process::Command::new("callgrind_control")
            .arg(format!("--vgdb-prefix={}", self.vgdb_prefix.display()))
            .arg("-d")
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("callgrind_control: {e}"))?;
        self.dumps += 1;
        let path = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        // callgrind_control returns once the dump is written; allow a moment
        // all the same before calling it missing.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && let Some(total) = totals(&text)
            {
                return Ok(total);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "callgrind wrote no dump at {} (callgrind_control said: {} {})",
                    path.display(),
                    String::from_utf8_lossy(&output.stdout).trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// The instruction count of a callgrind dump: its `totals:` line (its
/// `summary:` line in older formats). Only `Ir` is collected, so it is the
/// line's first number.
fn totals(dump: &str) -> Option<u64> {
    let line = dump
        .lines()
        .find(|l| l.starts_with("totals:"))
        .or_else(|| dump.lines().find(|l| l.starts_with("summary:")))?;
    line.split_once(':')?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The Redis a figure was counted on.
struct RedisBuild {
    version: String,
    build_id: String,
}

impl RedisBuild {
    async fn of(url: &str) -> Result<RedisBuild, String> {
        let mut conn = connection(url).await?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("INFO server: {e}"))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map_or_else(|| "?".to_string(), |v| v.trim().to_string())
        };
        Ok(RedisBuild {
            version: field("redis_version"),
            build_id: field("redis_build_id"),
        })
    }
}

/// A plain connection with no response timeout (callgrind slows Redis
/// some fifty times).
async fn connection(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("redis: {e}"))
}

async fn flushall(conn: &mut MultiplexedConnection) -> Result<(), String> {
    redis::cmd("FLUSHALL")
        .query_async::<()>(conn)
        .await
        .map_err(|e| format!("FLUSHALL: {e}"))
}

/// The keyspace of every shape: one shard, so that one `Store::add` is one
/// script call.
fn keyspace() -> Keyspace {
    Keyspace::new("ins", 1)
}

/// Milliseconds since the Unix epoch, on the host clock.
fn now_ms() -> u64 {
    load::now_micros() / 1000
}

/// A shape through `Store::add`, one call at a time.
async fn run_store(
    redis: &mut Profiled,
    shape: &Shape,
    rules: bool,
    policies: &Policies,
) -> Result<Measured, String> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(30),
        response: Duration::from_secs(300),
    };
    let store = Store::open(
        &RedisTarget::single(redis.url(), timeouts),
        keyspace(),
        policies.dedup,
        policies.handle.clone(),
    )
    .map_err(|e| format!("Store::open: {e}"))?;
    let policy = if rules {
        &policies.rules
    } else {
        &policies.plain
    };
    let new_item = |draw: &Draw, now: u64| {
        let mut item = Item::new(draw.id.as_bytes(), PAYLOAD.to_vec());
        if rules {
            item.measures.insert("weight_g".into(), draw.weight_g);
            item.measures.insert("volume_cm3".into(), draw.volume_cm3);
            item.deadline_ms = draw.deadline_s.map(|s| now + s * 1000);
        }
        NewItem {
            key: group_key(rules, draw.key),
            item,
            policy: policy.clone(),
            close: false,
            requeue_of: None,
        }
    };
    // Warm-up: loads whatever the store runs, then leaves Redis empty.
    let warm = NewItem {
        key: "warm-up".into(),
        ..new_item(&sequence(1)[0], now_ms())
    };
    store
        .add(vec![warm])
        .await
        .map_err(|e| format!("warm-up add: {e}"))?;
    flushall(&mut connection(redis.url()).await?).await?;
    redis.dump().await?;

    let draws = sequence(shape.items);
    let mut calls = 0;
    let mut added = 0;
    let mut batches = BTreeMap::new();
    for chunk in draws.chunks(shape.per_call) {
        let now = now_ms();
        let items = chunk.iter().map(|draw| new_item(draw, now)).collect();
        let report = store
            .add(items)
            .await
            .map_err(|e| format!("{}: add: {e}", shape.name))?;
        calls += 1;
        for result in &report.results {
            added += usize::from(result.outcome == AddOutcome::Added);
            for batch in &result.flushed {
                *batches
                    .entry(batch.reason.as_str().to_string())
                    .or_default() += 1;
            }
        }
    }
    let instructions = redis.dump().await?;
    if added != shape.items {
        return Err(format!(
            "{}: {added} of {} items were added; the figure would mean nothing",
            shape.name, shape.items
        ));
    }
    Ok(Measured {
        name: shape.name,
        checked: shape.checked(),
        items: shape.items,
        calls,
        instructions,
        batches,
        spread: None,
    })
}

/// A shape through the frozen floor script, one EVALSHA at a time.
async fn run_floor(
    redis: &mut Profiled,
    shape: &Shape,
    policy: &Policy,
) -> Result<Measured, String> {
    let mut conn = connection(redis.url()).await?;
    let shard = keyspace().shard(0);
    let max_wait_ms = policy.max_wait.as_millis() as u64;
    let call = |draws: &[Draw], keys: &dyn Fn(u64) -> String| {
        let mut invocation = FLOOR.prepare_invoke();
        invocation.key(&shard.due).key(&shard.stream);
        let mut groups: HashMap<u64, usize> = HashMap::new();
        let mut args: Vec<(usize, &Draw)> = Vec::with_capacity(draws.len());
        for draw in draws {
            let next = groups.len() + 1;
            let index = *groups.entry(draw.key).or_insert_with(|| {
                invocation.key(keyspace().group(0, &keys(draw.key)));
                next
            });
            args.push((index, draw));
        }
        invocation.arg(policy.max_items).arg(max_wait_ms);
        for (index, draw) in args {
            invocation.arg(index).arg(&draw.id).arg(&PAYLOAD[..]);
        }
        invocation
    };
    // Warm-up: loads the script, then leaves Redis empty.
    FLOOR
        .load_async(&mut conn)
        .await
        .map_err(|e| format!("SCRIPT LOAD of the floor: {e}"))?;
    let warm: Vec<redis::Value> = call(&sequence(1), &|_| "warm-up".into())
        .invoke_async(&mut conn)
        .await
        .map_err(|e| format!("warm-up floor call: {e}"))?;
    if warm.len() != 1 {
        return Err("the floor's warm-up call answered nothing".into());
    }
    flushall(&mut conn).await?;
    redis.dump().await?;

    let draws = sequence(shape.items);
    let keys = |n: u64| group_key(false, n);
    let mut calls = 0;
    let mut added = 0;
    let mut flushed = 0;
    for chunk in draws.chunks(shape.per_call) {
        let reply: Vec<redis::Value> = call(chunk, &keys)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("{}: floor call: {e}", shape.name))?;
        calls += 1;
        for value in reply {
            match value {
                redis::Value::Int(0) => {}
                redis::Value::Int(_) => added += 1,
                _ => {
                    added += 1;
                    flushed += 1;
                }
            }
        }
    }
    let instructions = redis.dump().await?;
    if added != shape.items {
        return Err(format!(
            "{}: {added} of {} items were added by the floor",
            shape.name, shape.items
        ));
    }
    Ok(Measured {
        name: shape.name,
        checked: shape.checked(),
        items: shape.items,
        calls,
        instructions,
        batches: BTreeMap::from([("SIZE".to_string(), flushed)]),
        spread: None,
    })
}

/// A baseline file: instructions per item by shape, and the Redis they
/// were counted on.
#[derive(serde::Deserialize)]
struct Baseline {
    redis_version: String,
    redis_build_id: String,
    per_item: BTreeMap<String, u64>,
}

impl Baseline {
    fn read(path: &Path) -> Result<Baseline, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the baseline {}: {e}", path.display()))?;
        toml::from_str(&text)
            .map_err(|e| format!("the baseline {} is malformed: {e}", path.display()))
    }

    fn render(measured: &[Measured], redis: &RedisBuild) -> String {
        let mut text = format!(
            "# Redis instructions per added item of batcher's add path, counted by\n\
             # callgrind (`batcher-bench instructions`; see\n\
             # src/bin/batcher-bench/instructions.rs for the shapes and the method).\n\
             # CI runs `--check` against this file and fails when a shape other than\n\
             # the floor's rises more than {rise:.0}% above its figure here. The floor_*\n\
             # shapes run bench/floor/floor.lua, which never changes.\n\
             #\n\
             # Regenerate with\n\
             #   cargo run --bin batcher-bench -- instructions --write bench/instructions.toml\n\
             # The baseline moves only in a commit that says why (the change that moves\n\
             # it, and by how much); counts depend on the Redis build, so a new Redis\n\
             # is a reason too.\n\
             redis_version = \"{version}\"\n\
             redis_build_id = \"{build}\"\n\
             \n\
             [per_item]\n",
            rise = MAX_RISE * 100.0,
            version = redis.version,
            build = redis.build_id,
        );
        for m in measured {
            text += &format!("{} = {}\n", m.name, m.per_item().round() as u64);
        }
        text
    }
}

/// Prints the table and the ratios; returns the checked shapes that rose
/// above their baseline by more than [`MAX_RISE`] (or have none).
fn print_table(
    measured: &[Measured],
    baseline: Option<&Baseline>,
    redis: &RedisBuild,
) -> Vec<String> {
    let mut failures = Vec::new();
    println!(
        "\nRedis {} (build {}), instructions counted inside {TOGGLE}:\n",
        redis.version, redis.build_id
    );
    println!(
        "{:<14} {:>6} {:>6} {:>14} {:>10} {:>10} {:>9} {:>8}  batches",
        "shape", "items", "calls", "instructions", "per call", "per item", "baseline", "change"
    );
    for m in measured {
        let base = baseline.and_then(|b| b.per_item.get(m.name).copied());
        let (base_text, change_text) = match base {
            Some(base) => {
                let change = m.per_item() / base as f64 - 1.0;
                if m.checked && change > MAX_RISE {
                    failures.push(format!("{} ({:+.1}%)", m.name, change * 100.0));
                }
                (base.to_string(), format!("{:+.2}%", change * 100.0))
            }
            None => {
                if m.checked && baseline.is_some() {
                    failures.push(format!("{} (not in the baseline)", m.name));
                }
                ("-".to_string(), "-".to_string())
            }
        };
        let batches: Vec<String> = (m.batches.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        println!(
            "{:<14} {:>6} {:>6} {:>14} {:>10.0} {:>10.0} {:>9} {:>8}  {}{}",
            m.name,
            m.items,
            m.calls,
            m.instructions,
            m.per_call(),
            m.per_item(),
            base_text,
            change_text,
            batches.join(", "),
            if m.checked {
                ""
            } else {
                " (floor: not checked)"
            }
        );
    }
    for m in measured {
        if let Some((starts, spread)) = m.spread {
            println!(
                "{}: the median of {starts} Redis starts, which spread {:.2}% (Redis's \
                 per-start hash seed)",
                m.name,
                spread * 100.0
            );
        }
    }
    let per_item = |name: &str| {
        measured
            .iter()
            .find(|m| m.name == name)
            .map(Measured::per_item)
    };
    let ratio = |a: &str, b: &str| Some(per_item(a)? / per_item(b)?);
    println!();
    if let Some(r) = ratio("every_rule", "addmany") {
        println!(
            "every_rule / addmany      = {r:.3}  (target ≤ {MAX_RULES_RATIO}: {})",
            if r <= MAX_RULES_RATIO {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    for (a, b) in [
        ("addmany", "floor_addmany"),
        ("unary", "floor_unary"),
        ("every_rule", "floor_addmany"),
    ] {
        if let Some(r) = ratio(a, b) {
            println!("{:<25} = {r:.2}", format!("{a} / {b}"));
        }
    }
    if let Some(b) = baseline {
        if b.redis_version != redis.version || b.redis_build_id != redis.build_id {
            println!(
                "\nNOTE: the baseline was counted on Redis {} (build {}), this run on {} (build {}): \
                 instruction counts of different builds differ, so regenerate the baseline if \
                 the Redis in use has changed.",
                b.redis_version, b.redis_build_id, redis.version, redis.build_id
            );
        }
        println!(
            "\nChecked shapes may rise at most {:.0}% above the baseline.",
            MAX_RISE * 100.0
        );
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_callgrind_totals() {
        let dump =
            "version: 1\ncmd: redis-server\nevents: Ir\nsummary: 123\nfn=x\n1 2\ntotals: 12345\n";
        assert_eq!(totals(dump), Some(12345));
        assert_eq!(totals("summary: 77\n"), Some(77));
        assert_eq!(totals("events: Ir\n"), None);
    }

    #[test]
    fn the_sequence_is_fixed() {
        let a = sequence(50);
        let b = sequence(50);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.key == y.key && x.id == y.id)
        );
        assert_eq!(a[0].id.len(), 25);
        assert_eq!(group_key(true, a[0].key).len(), 15);
        assert!(a.iter().any(|d| d.deadline_s.is_some()));
    }

    #[test]
    fn both_policies_resolve() {
        let p = policies().expect("policies");
        assert_eq!(p.plain.max_items, 10);
        assert_eq!(p.rules.min_items, 3);
        assert!(p.rules.cutoffs.is_some());
    }

    #[test]
    fn a_written_baseline_reads_back() {
        let measured = vec![Measured {
            name: "addmany",
            checked: true,
            items: 10,
            calls: 1,
            instructions: 12_345,
            batches: BTreeMap::new(),
            spread: None,
        }];
        let redis = RedisBuild {
            version: "7.0.15".into(),
            build_id: "abc".into(),
        };
        let text = Baseline::render(&measured, &redis);
        let back: Baseline = toml::from_str(&text).expect("parses");
        assert_eq!(back.per_item.get("addmany"), Some(&1235));
        assert_eq!(back.redis_version, "7.0.15");
    }
}
