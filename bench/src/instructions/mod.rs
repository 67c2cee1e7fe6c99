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
//! Shapes, each through the public [`Store`](batcher::store::Store) API (so
//! the harness survives changes of the scripts behind it), over
//! [`KEYS`](shapes::KEYS) keys drawn by a seeded xorshift, 15-byte keys,
//! 25-byte ids and 32-byte payloads as in the other scenarios:
//! - `addmany`: [`ITEMS`](shapes::ITEMS) items in calls of 100, policy
//!   max_items 10, max_wait 1 h (groups flush by SIZE, as in production);
//! - `unary`: the first [`UNARY_ITEMS`](shapes::UNARY_ITEMS) of the same
//!   items, one per call;
//! - `rounds`: the same items as `unary`, [`ROUND_ITEMS`](shapes::ROUND_ITEMS)
//!   to a call of the store over a keyspace of
//!   [`ROUND_SHARDS`](shapes::ROUND_SHARDS) shards, the service's default:
//!   the shape of unary adds under load, whose round writers send each
//!   lane's shards in one `add_shards` call (the runtime here has one
//!   thread, so every part of a store call is queued before a writer
//!   runs: two calls, one per lane, each a section per shard);
//! - `sharded`: the same items as `addmany`, in calls of 100 over a
//!   keyspace of [`ROUND_SHARDS`](shapes::ROUND_SHARDS) shards: the calls
//!   scenario 1 makes, each split by shard into sections of about six
//!   items (two `add_shards` calls per store call, one per lane), so each
//!   section's own commands (its dedup lookup, due set and flushed-set
//!   upkeep) are shared by fewer items than in `addmany`;
//! - `every_rule`: as `addmany`, under scenario 11's policy with every rule
//!   on ([`RULES_CONFIG`](crate::policies::RULES_CONFIG), parsed by the
//!   service's own config code) and its parcels: a weight and a volume on
//!   every item, a deadline 10 to 40 minutes ahead on one in ten;
//! - `floor_addmany`, `floor_unary`: the same items as `addmany` and
//!   `unary`, through `bench/floor/floor.lua` with EVALSHA on a plain
//!   connection: the least an add script can do (HSETNX and HLEN per item,
//!   ZADD when a group opens, HGETALL, XADD, DEL and ZREM when it fills).
//!   That file is frozen, so the ratios to it compare with earlier runs;
//! - `floor_dedup`: the same items as `addmany` through
//!   `bench/floor/floor_dedup.lua`, frozen too: the floor plus a dedup
//!   window of 10 minutes in a sorted set per shard, as batcher keeps one
//!   (one ZMSCORE per call, one ZADD of the flushed items). It is the least
//!   an add script with batcher's idempotency does.
//! - `floor_batch`: the same items as `addmany` through
//!   `bench/floor/floor_batch.lua`, frozen too: `floor_dedup` plus what
//!   batcher keeps of a plain group and its batch, each at the least cost
//!   measured (a sequence number from HLEN and the arrival time in each
//!   item's value, the opening time written with the first item, the batch
//!   in batcher's stream format). It is the least an add script with
//!   batcher's semantics of a plain group does; `addmany / floor_batch` is
//!   what our add does beyond it. `floor_batch_unary` runs it on `unary`'s
//!   items, one a call: the floor of a one-item call with these semantics,
//!   beside `unary` (and `rounds`, the same items as the service sends
//!   them under load).
//! - `floor_fields`: the same items as `addmany` through
//!   `bench/floor/floor_fields.lua`, frozen too: `floor_batch` with the
//!   batch as format 4 writes it (the group's hash passed to XADD as it
//!   is, the items ordered by their readers). It is the least an add
//!   script with batcher's semantics of a plain group does in format 4;
//!   `addmany / floor_fields` is what our add does beyond it.
//! - `floor_counters`: the same items as `addmany` through
//!   `bench/floor/floor_counters.lua`, frozen too: `floor_fields` with a
//!   group's counters as our layout keeps them (read with the item's id in
//!   one HMGET, written with the item in one HSET) in place of HLEN and
//!   HSETNX. `addmany / floor_counters` is what our add does beyond its
//!   layout; `floor_counters / floor_fields` is what the counters cost.
//! - `floor_rounds`: `floor_batch` on `rounds`' items, sent as `rounds`
//!   sends them: [`ROUND_ITEMS`](shapes::ROUND_ITEMS) to a store call over
//!   [`ROUND_SHARDS`](shapes::ROUND_SHARDS) shards, a call per lane of shards
//!   with items and in it a section per shard, each section the frozen
//!   script run once with its shard's KEYS and ARGV (a function of a
//!   library that wraps the script's text unchanged; see
//!   `floors::sections_library`). The floor of the call shape of unary adds
//!   under load: `rounds / floor_rounds` is what our sections do beyond
//!   it, and `floor_rounds / floor_batch_unary` what sending the same items
//!   in sections saves the floor over one call each.
//! - `floor_rules`: the same items as `every_rule`, with their parcels,
//!   through `bench/floor/floor_rules.lua`, frozen too: `floor_dedup` plus
//!   every rule of `every_rule`'s policy (one HMGET and one HSET of a
//!   group's counters per item, the capacity checked before the item
//!   goes in, the due set moved only earlier). `floor_rules /
//!   floor_dedup` is what the rules cost at the floor, beside
//!   `every_rule / addmany`.
//!
//! Each runs on a Redis of its own, [`PARALLEL`] at a time (valgrind runs
//! Redis some fifty times slower): on two busy cores the whole table took
//! 120 s, and `--check`, which runs our five shapes only, 24 s. The sizes are fixed
//! constants, small for that reason (halving them moved the per-item
//! figures by about 1%).
//!
//! With `--peer`, two more shapes count the peer, BullMQ (bench/peer, whose
//! packages must be installed: `npm ci` there): `bullmq_addbulk` and
//! `bullmq_add` run `bench/peer/bullmq.mjs --count`, which adds jobs shaped
//! like our items (a 15-byte name over 1,000 keys, a 25-byte id and a 32-byte
//! payload) one call at a time, `addBulk` of 100 or `add`, after one job that
//! loads BullMQ's scripts. Every command BullMQ sends is counted, its
//! `EVALSHA`s and the rest. CPU time on a shared machine swings within
//! minutes; instructions do not, so this gives the same-sitting comparison
//! of `bench/peer/run` a second yardstick (instructions are not time: cache
//! misses, which grow with what each side keeps, count in time only).
//!
//! The figure is instructions per item (and per call). The floor and peer
//! shapes are printed but never checked. `--write PATH` writes the figures as a
//! baseline (`bench/instructions.toml`); `--check PATH` runs our shapes only
//! (the floors, held to nothing, are four fifths of the work), compares
//! with the baseline and exits 1 when one rose more than [`MAX_RISE`] above it.
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
//! (cd bench/peer && npm ci) && cargo run --bin batcher-bench -- instructions --peer
//! ```
//!
//! With `BATCHER_CALLGRIND_KEEP=DIR` each dump is also copied to
//! `DIR/<redis pid>.<dump number>`, for `callgrind_annotate --inclusive=yes`
//! to say where a shape's instructions go (the second dump of a Redis is
//! its shape; its `totals:` line matches the table's count).
//! `BATCHER_CALLGRIND_ARGS` adds options to callgrind's, e.g.
//! `"--cache-sim=yes --LL=524288,8,64"` to count, beside the instructions,
//! the misses of a simulated cache the size of this machine's L2 per core
//! (`callgrind_annotate --show=Ir,DLmr,DLmw --sort=DLmr` on a kept dump):
//! the table still gives instructions alone.
//!
//! Layout: this file (the options, and the run: measure every shape, compare,
//! check or write), `shapes.rs` (the shapes, their seeded items and their
//! policies), `profiled.rs` (a redis-server under callgrind, and the Redis
//! build it is), `routes.rs` (a shape through `Store::add` or through the
//! floor script) and `baseline.rs` (the baseline file, and the table that
//! compares with it).

mod baseline;
mod floors;
mod profiled;
mod routes;
mod shapes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use baseline::{Baseline, MAX_RISE, print_table};
use floors::run_floor;
use profiled::check_tools;
use profiled::{Profiled, RedisBuild};
use routes::{run_peer, run_store};
use shapes::{PEER_SHAPES, Policies, Route, SHAPES, Shape, policies};

/// Shapes run at once, each on its own Redis (callgrind keeps a process on
/// one core, and each waits on its client between calls).
const PARALLEL: usize = 3;
/// The baseline the table compares with when neither --check nor --write is given.
const DEFAULT_BASELINE: &str = "bench/instructions.toml";

/// The options of `batcher-bench instructions`.
#[derive(clap::Args)]
pub struct Opts {
    /// Write the figures to this baseline file (bench/instructions.toml).
    #[arg(long, value_name = "PATH", conflicts_with = "check")]
    write: Option<PathBuf>,
    /// Compare with this baseline and exit 1 if a shape of ours rose more
    /// than 3% above it. Only our shapes run: the floors, held to nothing,
    /// are left out.
    #[arg(long, value_name = "PATH")]
    check: Option<PathBuf>,
    /// Also count BullMQ's `addBulk` and `add` (bench/peer, which must have
    /// its packages: `npm ci` there, or one `bench/peer/run`): the peer in
    /// instructions, beside the same sitting's CPU time.
    #[arg(long, conflicts_with_all = ["write", "check"])]
    peer: bool,
    /// Also write the figures as JSON to this file (`{"redis": version,
    /// "per_item": {shape: instructions per item}}`): what `bench/peer/run`
    /// puts in BENCHMARKS.md beside the sitting's times.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
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
    /// A store or floor shape's figure once its calls ran, or an error
    /// unless they added every item (`who` added them): with duplicates or
    /// refusals the count would mean nothing.
    fn of_shape(
        shape: &Shape,
        who: &str,
        added: usize,
        calls: usize,
        instructions: u64,
        batches: BTreeMap<String, u64>,
    ) -> Result<Measured, String> {
        if added != shape.items {
            return Err(format!(
                "{}: {added} of {} items were added by {who}; the figure would mean nothing",
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
    // A check counts only the shapes it checks: the floors are frozen and
    // held to nothing, and they are four fifths of the work.
    let shapes: Vec<&Shape> = SHAPES
        .iter()
        .filter(|shape| opts.check.is_none() || shape.checked())
        .chain(PEER_SHAPES.iter().filter(|_| opts.peer))
        .collect();
    let (measured, redis) = match measure_all(&shapes).await {
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
    if let Some(path) = &opts.json {
        let per_item: serde_json::Map<String, serde_json::Value> = (measured.iter())
            .map(|m| (m.name.to_string(), (m.per_item().round() as u64).into()))
            .collect();
        let json = serde_json::json!({ "redis": redis.version, "per_item": per_item });
        if let Err(e) = std::fs::write(path, format!("{json}\n")) {
            eprintln!(
                "batcher-bench instructions: cannot write {}: {e}",
                path.display()
            );
            return ExitCode::FAILURE;
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
    super::repo_root()
}

/// Runs every shape, each on fresh profiled Redis servers ([`PARALLEL`] at
/// once: the counts do not depend on timing); also returns that Redis's
/// version and build id.
async fn measure_all(shapes: &[&Shape]) -> Result<(Vec<Measured>, RedisBuild), String> {
    use futures::StreamExt;
    check_tools()?;
    let policies = policies()?;
    let jobs = shapes
        .iter()
        .flat_map(|shape| std::iter::repeat_n(*shape, shape.starts()));
    let runs: Vec<_> = futures::stream::iter(jobs.map(|shape| measure(shape, &policies)))
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut runs = runs.into_iter();
    let mut measured = Vec::new();
    let mut build = None;
    for shape in shapes {
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
        Route::Floor(floor) => run_floor(&mut redis, shape, policies, floor).await?,
        Route::Peer { bulk } => run_peer(&mut redis, shape, bulk).await?,
    };
    eprintln!(
        "{:<14} {:>8.0} instructions per item ({:.1} s)",
        m.name,
        m.per_item(),
        started.elapsed().as_secs_f64()
    );
    Ok((m, build))
}
