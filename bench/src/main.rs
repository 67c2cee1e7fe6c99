//! `batcher-bench`: the benchmark harness of batcher.
//!
//! Layout: `main.rs` (this: the CLI and the dispatch to the hidden
//! subcommands and `instructions`), `serve.rs` (the hidden `__serve`: the
//! service under test),
//! `service.rs` (the config under test and a fresh service per scenario),
//! `results.rs` (runs the scenarios in order), one file per
//! scenario (`ingest.rs`, `precision.rs`, `fanout.rs`, `scale.rs`,
//! `remembered.rs`, `overload.rs`, `policies.rs`, `cluster.rs`, `calls.rs`) over `scenarios.rs` (what they share) and
//! `load.rs` (load generation), `procs.rs` (child processes, started with
//! the `batcher-testkit` crate that the integration tests use too; CPU and RSS),
//! `floor_serve.rs` (the frozen service floor of row 2c),
//! `floor_serve_many.rs` (the frozen AddMany service floor of row 1c),
//! `store_load.rs` (the hidden `__store_load`: our add path without the
//! service, driven as `bench/peer/floor.mjs` drives the floors),
//! `reports.rs` and `cluster_report.rs` (results to rows and notes),
//! `report.rs` (the table and BENCHMARKS.md),
//! `method.rs` (its "How each figure is computed") and `charts/` (its SVG
//! charts, drawn with plotters) and `instructions/` (the
//! `instructions` subcommand).
//!
//! ```sh
//! cargo run --release --bin batcher-bench              # full run, writes BENCHMARKS.md
//! cargo run --release --bin batcher-bench -- --quick   # smoke run (CI), well under 2 minutes
//! cargo run --bin batcher-bench -- instructions --check bench/instructions.toml   # CI
//! ```
//!
//! `batcher-bench instructions` is a yardstick of the add path that the
//! machine cannot move: it runs a fixed, seeded workload (AddMany-sized and
//! unary calls, with the plain policy and with every rule on, and the same
//! items through the frozen floor script `bench/floor/floor.lua`) through
//! `Store::add` against a redis-server under callgrind, and reports the
//! Redis instructions per item, counted only while Redis parses and runs
//! the commands. The counts repeat within about 0.1% whatever the load, so
//! `--check` fails CI when a shape of ours rises more than 3%
//! above the baseline `bench/instructions.toml` (`--write` regenerates it,
//! in a commit that says why). It needs valgrind (`scripts/ensure-valgrind`);
//! see `instructions/`.
//!
//! The report links four SVG charts, written to a directory next to it:
//! `bench/` beside BENCHMARKS.md in a full run, `target/bench-quick/` with
//! `--quick` and `target/bench-partial/` with `--only` (beside their reports),
//! so CI draws every chart it has data for without touching the repository.
//! They are: ingest throughput through the service (rows 1, 2, 9 and 11),
//! the timeout lateness histogram
//! (scenario 3), flush-to-subscriber latency by percentile (scenario 4), and
//! p99 Add latency against open groups (scenario 5).
//!
//! By default it starts its own `redis-server` (free loopback port, temporary
//! directory, no persistence) and runs the service as a child process (this
//! binary re-executed with the hidden `__serve` subcommand), so the service's
//! RSS and CPU time can be read apart from the load generator's. A fresh
//! service is started for each scenario, after a FLUSHALL of the bench's own
//! Redis. `--redis-url` and `--service` target given ones instead; an external
//! Redis is never flushed (every key and id carries a per-run tag), and an
//! external service must run the config `--print-config` prints. Every child
//! is killed when the bench exits, panics, or is interrupted.
//!
//! Redis, the service and the load generator share the machine, so the
//! throughputs here are reference figures of this machine and run, and no
//! row is a ratio to a measure made of our own code. Two yardsticks our code
//! cannot move judge them instead: `bench/peer/run` compares throughput and
//! Redis CPU per item with BullMQ's in the same sitting, and `batcher-bench
//! instructions` counts the Redis instructions per item (above). The exit
//! status is 0 whatever the figures; it is 1 only if a scenario could not
//! run at all.
//!
//! # Scenarios
//! 1. **Ingest through AddMany.** 16 callers over 4 HTTP/2 connections send
//!    AddMany calls of 100 items, each under one of 10k keys at random
//!    (policy: max_items 10), for 10 s (quick: 2 s) after a 1 s warm-up.
//!    Figure: items added by calls that completed inside the window, divided
//!    by the window; a reference figure, no target. Second figure
//!    (row 1b): Redis CPU µs per added item, redis-server's user+sys CPU time
//!    over the window (`/proc/<pid>/stat`, so only with the bench's own
//!    Redis) divided by the items added in it. Target: ≤ 8 µs.
//! 2. **Ingest through unary Add.** The same with 64 callers over 8
//!    connections, one item per call. Figure: adds per second, call latency
//!    p50/p99, and Redis CPU µs per added item; reference figures, no
//!    target. Second figure (row 2b): the service's CPU µs per add, its
//!    user+sys CPU time over the window (`/proc/<pid>/stat`, so only with the
//!    bench's own service) divided by the adds completed in it. Target:
//!    ≤ 20 µs.
//! 3. **Timeout precision.** A subscriber is started, then 100k one-item
//!    groups (quick: 5k) are opened evenly within 5 s (quick: 1 s), group i
//!    under the key glob with max_wait (1 + i mod 12) × 5 s (quick: (1 + i mod
//!    5) × 1 s), so due times spread evenly over 60 s (quick: 5 s). For each
//!    batch received, lateness = flushed_at − (opened_at + max_wait), all on
//!    the Redis clock, in whole milliseconds. Figure: p50, p99, max lateness,
//!    and groups missed (no batch within 5 s of the last due time). Target:
//!    p99 ≤ 5 ms, max ≤ 25 ms, none missed.
//! 4. **Flush to subscriber.** 100 subscribers, each on its own connection,
//!    subscribe to a key prefix; 100 groups per second are completed (AddMany
//!    of 10 items under a fresh key, which flushes by SIZE) for 10 s (quick:
//!    2 s). Latency = the subscriber's receive time (host clock) − the batch's
//!    flushed_at (Redis clock, same host; Redis reports whole milliseconds, so
//!    this overstates by 0–1 ms). Figure: p50/p99 over every delivery.
//!    Target: p99 ≤ 5 ms. The service's RSS is sampled every 100 ms meanwhile.
//! 5. **Scale.** 1k one-item groups (policy: max_items 1000, max_wait 1 h)
//!    are opened and a fresh service is started over them. 4 probers then
//!    each add one item under a fresh key and remove it again, 20k times in
//!    all (quick: 4k) after a tenth as many unrecorded, so the probe opens a
//!    group (the add path that also touches the due set) without changing the
//!    count. That service then opens groups up to 1M (quick: 20k), and the
//!    probe runs on another fresh service, so the two probes differ only in
//!    the number of open groups (the probe on the service that did the
//!    opening is reported too, as is Redis's time per script call during each
//!    probe). The opening stops at each power of ten on the way (10k, 100k;
//!    quick: 10k) for the same probe on that service, for the chart; its
//!    groups/s and CPU leave the probes out. Figure: p99 Add latency at 1M /
//!    at 1k. Target: ≤ 1.25.
//! 6. **Redis memory per open group.** Redis `used_memory` after opening the
//!    groups from 1k to 1M, minus before, divided by the groups opened (one
//!    item each: 15-byte key, 25-byte id, 32-byte payload). Target: ≤ 400 bytes.
//! 7. **Service RSS.** VmRSS of a fresh service after the probe, over 1k and
//!    over 1M open groups: the same history, so a difference could only be
//!    state held per open group. Also reported: the RSS of the service that
//!    opened the 1M groups, after its probe, and the peak RSS while streaming
//!    to 100 subscribers (scenario 4, sampled every 100 ms). Target: RSS must
//!    not grow with open groups; held when RSS at 1M ≤ 1.25× RSS at 1k.
//! 8. **Redis memory per remembered item id.** 200k items (quick: 20k) are
//!    added through AddMany, ten under each of 20k fresh keys (max_items 10;
//!    15-byte key, 25-byte id), so every group flushes by SIZE and every id
//!    is remembered for the dedup window in its shard's flushed set. Figure:
//!    `MEMORY USAGE <flushed set> SAMPLES 0` summed over the shards, divided
//!    by their `ZCARD` total: exactly the remembered ids, in Redis's own
//!    allocation sizes. Cross-check in the details: (`used_memory` after −
//!    before − `MEMORY USAGE` of the shard streams) / items. No target.
//! 9. **AddMany on a 3-master cluster.** The library's launcher starts a
//!    Redis Cluster of 3 masters, no replicas, no persistence
//!    (`redis-cli --cluster create`: the default even split of the slots),
//!    and a fresh service runs the bench's config with `[redis]
//!    cluster_nodes` naming its nodes instead of `url`. Scenario 1's load
//!    runs against it unchanged. Figures: items/s, next to scenario 1's in
//!    the same run (when both run); Redis CPU µs per item over all masters
//!    (row 9); each master's share of the items, as ids in the flushed sets
//!    of the shards whose slots it owns after the run, with its expected
//!    share (of the load's 10k keys, those whose shard's tag hashes to its
//!    slots) and its share of the masters' CPU in the details; max/min share,
//!    target ≤ 1.2 (row 9b); each master's CPU over the window / (items added
//!    in the window × its share) (row 9c). Row 9d is computed, not measured:
//!    how many of N shards each master owns under the default split, for N =
//!    16 … 1024, and the smallest N with max/min ≤ 1.2, for the bench's
//!    prefix and the default one. The details end with a projection from the
//!    measured cost: items/s per master core = 1e6 / µs per item, and the
//!    masters 100k, 500k and 1M items/s need. Not run with `--service`.
//! 10. **Overload.** On a fresh service over an emptied Redis, scenario 1's
//!     closed-loop load first measures the items/s the service takes (its
//!     capacity); then AddMany calls of 100 items (10k keys) are sent
//!     open-loop at a fixed rate of 2× that, over 16 connections, for 10 s
//!     (quick: 2 s) after the warm-up, whatever the replies. Figures, over
//!     calls completing inside the window: accepted items/s (and as a
//!     multiple of capacity), the share of calls refused RESOURCE_EXHAUSTED,
//!     accepted calls' p50/p99, other errors (there must be none), and the
//!     service's VmRSS sampled every 100 ms from the open loop's start (max,
//!     idle before the load, and the series in the details). Target: the
//!     RSS stops growing (its peak over the series' second half ≤ 1.2× its
//!     peak over the first; a queue without bound would grow it in step
//!     with time, towards 2×), p99 ≤ 1 s (half the default deadline),
//!     refusals present, no other errors.
//! 11. **Every policy rule on.** Scenario 1's load runs eight times, in the
//!     order (a), (b), (b), (a), twice (quick: (a), (b)), each on a fresh
//!     service over an emptied Redis: (a) under the plain policy (max_items 10, max_wait 1 h),
//!     unchanged; (b) under the glob `pr-*` with every rule on: max_items
//!     10, max_wait 1 h, max_idle 30 min, capacity 27 kg and 54 l, four
//!     cutoffs a day in Europe/Berlin, deadline_lead 5 min, min_items 3 with
//!     max_age 2 h. In (b) every item
//!     carries `measures` (weight_g 200–4800, volume_cm3 1000–9000, drawn
//!     evenly, so about half the groups flush by CAPACITY and half by SIZE)
//!     and one in ten a `deadline` 10 to 40 minutes ahead. Figure: Redis CPU
//!     µs per added item of each (as row 1b), pooled over its runs, the
//!     ratio (b)/(a), and their mean items/s; the details give each run's
//!     batches by reason (warm-up included). Target: ratio ≤ 1.3, and (b)
//!     wrote CAPACITY batches (else the rules were not in force). Only with
//!     the bench's own Redis.
//! 12. **Adds per call.** On a fresh service over an emptied Redis, with the
//!     service idle, the `FCALL`s Redis runs (`cmdstat_fcall` in INFO
//!     commandstats) are counted for 2 s (quick: 0.5 s): the sweepers' due
//!     scans. Then scenario 2's unary Add load runs at 1, 8 and 64 callers
//!     (over 1, 8 and 8 connections), each for the warm-up and the window.
//!     Figures, per level: adds per second, call latency p50/p99, and adds
//!     per call of the add path = adds completed in the window / (`FCALL`s
//!     in the window − the idle rate × the window). At one caller it must
//!     be 1.0; a sweeper woken by adds scans a little more often under
//!     load, so more callers' figures err low, if anything. No target.
//! 13. **The policy store at postcode scale** (`policy_store.rs`), over an
//!     emptied Redis with `[policy_store]` on and 100k exact areas plus 100
//!     globs (quick: 10k): start-up from spawn to the first accepted add
//!     (target ≤ 2 s, row 13a); a change made through one of 3 instances
//!     until each applies it, 1,000 changes (quick: 30), p99 target ≤ 1 s
//!     (13b); Redis and service memory per area (13c, reference); and the
//!     policy lookup per add, big table vs the bench's own patterns,
//!     target at most 600 ns more (3% of 20 µs; 13d). Only with the
//!     bench's own Redis and service.
//! 14. **Tracing on** (`tracing_cost.rs`): scenario 1's load with a W3C
//!     traceparent on every item, on a fresh service over an emptied Redis,
//!     tracing off, on, on, off (quick: off, on), exporting over OTLP to a
//!     receiver in the bench's process. Figure: the service's CPU µs per
//!     added item on and off, pooled, and their ratio; no target. Only with
//!     the bench's own Redis and service.

mod calls;
mod charts;
mod cluster;
mod cluster_report;
mod fanout;
mod floor_serve;
mod floor_serve_many;
mod ingest;
mod instructions;
mod load;
mod method;
mod overload;
mod policies;
mod policy_store;
mod precision;
mod procs;
mod remembered;
mod report;
mod reports;
mod runner;
mod scale;
mod scenarios;
mod serve;
mod service;
mod store_load;
mod tracing_cost;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use batcher::config::{MAX_WORKER_THREADS, default_worker_threads};
use clap::{Parser, Subcommand};

use report::Results;
use scenarios::Sizes;
use service::Env;

#[derive(Parser)]
#[command(
    about = "Benchmarks batcher through its gRPC API, beside yardsticks its code cannot move"
)]
struct Args {
    /// Smoke run: small sizes and short windows (CI runs this).
    #[arg(long)]
    quick: bool,
    /// Use this Redis instead of starting one. It is never flushed.
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// Use the service at this address instead of starting one; it must use
    /// the Redis given by --redis-url and the config --print-config prints.
    #[arg(long, value_name = "ADDR", requires = "redis_url")]
    service: Option<SocketAddr>,
    /// Where to write the report [default: BENCHMARKS.md in the repository;
    /// with --quick, target/BENCHMARKS.quick.md; with --only,
    /// target/BENCHMARKS.partial.md]. The charts go to a directory beside
    /// it: bench/, bench-quick/ or bench-partial/.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Run only these scenarios (comma-separated: 1,2,...,12;
    /// 5, 6 and 7 run together; 9 compares with 1 when both run), e.g. to
    /// profile one of them.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Vec<String>,
    /// Run the service in this many shards (`[redis] shards`; scenario 9's
    /// cluster keeps the default), e.g. to measure what the count costs.
    #[arg(long, value_name = "N", default_value_t = service::SHARDS,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    shards: u16,
    /// Run the service on this many threads (`worker_threads`; scenario 9's
    /// cluster keeps its default), e.g. to measure what a second one costs.
    /// Unset, the service picks its default (one on a single Redis).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_WORKER_THREADS as i64))]
    worker_threads: Option<u16>,
    /// The frozen floor script of bench/floor/ that row 1c's AddMany
    /// service floor serves (floor_dedup, floor_fields or floor_counters).
    #[arg(long, value_name = "SCRIPT", default_value = floor_serve_many::DEFAULT_SCRIPT,
          value_parser = clap::builder::PossibleValuesParser::new(floor_serve_many::SCRIPT_NAMES))]
    floor_many: String,
    /// Print the service config the bench runs, and exit.
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the service under test (the bench starts itself with this).
    #[command(name = "__serve", hide = true)]
    Serve {
        #[arg(long)]
        config_toml: String,
    },
    /// Runs the frozen service floor (row 2c; see floor_serve.rs).
    #[command(name = "__floor_serve", hide = true)]
    FloorServe {
        #[arg(long)]
        redis_url: String,
    },
    /// Runs the frozen AddMany service floor (row 1c; see floor_serve_many.rs).
    #[command(name = "__floor_serve_many", hide = true)]
    FloorServeMany {
        #[arg(long)]
        redis_url: String,
        /// The floor script of bench/floor/ it serves.
        #[arg(long, default_value = floor_serve_many::DEFAULT_SCRIPT)]
        script: String,
    },
    /// Counts the Redis instructions per added item under callgrind, and
    /// writes or checks the baseline (bench/instructions.toml).
    Instructions(instructions::Opts),
    /// Runs batcher's add path without the service, as floor.mjs runs the
    /// floors (see store_load.rs).
    #[command(name = "__store_load", hide = true)]
    StoreLoad(store_load::Opts),
}

/// mimalloc: the service allocates and frees small buffers on every call,
/// where glibc's malloc costs about a seventh of its CPU.
/// Built without transparent huge pages (`no_thp` in Cargo.toml), which
/// halves the idle RSS at no cost in CPU (bench/sittings/10-32985c9.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut args = Args::parse();
    match args.command.take() {
        Some(Command::Serve { config_toml }) => return serve::main(&config_toml),
        Some(Command::FloorServe { redis_url }) => {
            return hidden("__floor_serve", floor_serve::serve(&redis_url), drop);
        }
        Some(Command::FloorServeMany { redis_url, script }) => {
            let future = floor_serve_many::serve(&redis_url, &script);
            return hidden("__floor_serve_many", future, drop);
        }
        Some(Command::Instructions(opts)) => return instructions::main(opts),
        Some(Command::StoreLoad(opts)) => {
            return hidden("__store_load", store_load::run(opts), |line| {
                println!("{line}")
            });
        }
        None => {}
    }
    if args.print_config {
        let url = args
            .redis_url
            .as_deref()
            .unwrap_or("redis://127.0.0.1:6379");
        print!(
            "{}",
            service::service_config(url, args.shards, args.worker_threads)
        );
        return ExitCode::SUCCESS;
    }
    let threads: usize = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("batcher-bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The main future runs on this thread, which is the one that spawns every
    // child (see procs.rs). Ctrl-C drops it, and with it every child.
    runtime.block_on(async {
        tokio::select! {
            code = bench(args) => code,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("batcher-bench: interrupted");
                ExitCode::FAILURE
            }
        }
    })
}

/// Runs a hidden subcommand's `future` on a runtime of its own: `done`
/// takes its result; an error ends it with a message naming `name`.
fn hidden<T>(
    name: &str,
    future: impl std::future::Future<Output = Result<T, String>>,
    done: impl FnOnce(T),
) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(future) {
        Ok(value) => {
            done(value);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("batcher-bench {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every scenario (or those --only names), prints the table and writes
/// the report and its charts.
async fn bench(args: Args) -> ExitCode {
    let started = Instant::now();
    let load_before = report::load_average();
    let sizes = Sizes::new(args.quick);
    let run_tag = format!(
        "{:04x}",
        (std::process::id() ^ (load::now_micros() as u32)) & 0xffff
    );
    let mut results = Results::new(args.only.clone());
    let started_env = Env::start(
        args.redis_url.clone(),
        args.service,
        args.shards,
        args.worker_threads,
    );
    let mut env = match started_env.await {
        Ok(env) => env,
        Err(e) => {
            eprintln!("batcher-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    env.floor_many_script = args.floor_many.clone();
    let redis_version = scenarios::redis_version(&env.redis_url).await;
    if env.redis.is_none() {
        results.notes.push(format!(
            "Redis was external ({}): it was not flushed between scenarios, so \
             memory and latency figures include whatever else it holds.",
            env.redis_url
        ));
    }
    if args.shards != service::SHARDS {
        results.notes.push(format!(
            "The service ran in {} shards (--shards), not the default {}.",
            args.shards,
            service::SHARDS
        ));
    }
    let single_redis = default_worker_threads(false);
    if let Some(threads) = args.worker_threads
        && usize::from(threads) != single_redis.get()
    {
        results.notes.push(format!(
            "The service ran on {threads} threads (--worker-threads), not the default {single_redis} \
             (one on a single Redis; scenario 9's cluster keeps its own default)."
        ));
    }
    runner::run_all(&mut results, &mut env, &sizes, &run_tag, args.quick).await;

    println!("\n{}", report::text_table(&results.rows));
    for note in &results.notes {
        println!("- {note}");
    }
    let written = write_report(&args, &results, &env, &load_before, &redis_version);
    if written {
        println!("({:.0} s in all)", started.elapsed().as_secs_f64());
    }
    if results.failed || !written {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Draws the charts and writes the report that links them; false if either
/// could not be written.
fn write_report(
    args: &Args,
    results: &Results,
    env: &Env,
    load_before: &str,
    redis_version: &str,
) -> bool {
    // Before the charts are drawn: they are tracked files, and rewriting
    // them would mark the commit dirty.
    let commit = report::git_commit();
    let out = out_path(args);
    let root = out.parent().unwrap_or(Path::new("."));
    let chart_dir = chart_dir(args);
    let _ = std::fs::create_dir_all(root);
    let mut written = true;
    let links = match charts::write_all(&results.charts, &root.join(chart_dir)) {
        Ok(links) => {
            let dir = root.join(chart_dir);
            println!("\ndrew {} charts in {}", links.len(), dir.display());
            links
        }
        Err(e) => {
            eprintln!("batcher-bench: {e}");
            written = false;
            Vec::new()
        }
    };
    let machine = report::Machine::detect();
    let document = report::Document {
        rows: &results.rows,
        notes: &results.notes,
        charts: &charts::markdown(&links, chart_dir),
        machine: &machine,
        load_before,
        command: &report::command_line(),
        date: &report::utc_now(),
        mode: if args.quick {
            "quick (smoke run; small sizes)"
        } else {
            "full"
        },
        redis_version,
        commit: &commit,
        config: &env
            .config_text
            .replace(&env.redis_url, "<the bench's own redis-server>"),
        method: method::METHOD,
        sitting: &report::kept_sitting(&out),
    };
    match std::fs::write(&out, document.render()) {
        Ok(()) => println!("wrote {}", out.display()),
        Err(e) => {
            eprintln!("batcher-bench: cannot write {}: {e}", out.display());
            written = false;
        }
    }
    written
}

/// Where the report goes: --out, or by mode (see `Args::out`).
fn out_path(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| {
        let root = repo_root();
        if args.quick {
            root.join("target").join("BENCHMARKS.quick.md")
        } else if !args.only.is_empty() {
            root.join("target").join("BENCHMARKS.partial.md")
        } else {
            root.join("BENCHMARKS.md")
        }
    })
}

/// The charts' directory, next to the report (so its links are relative):
/// `bench/` for a full run, `bench-quick/` or `bench-partial/` otherwise,
/// so a quick or partial run never overwrites the full run's charts.
fn chart_dir(args: &Args) -> &'static str {
    if args.quick {
        "bench-quick"
    } else if !args.only.is_empty() {
        "bench-partial"
    } else {
        "bench"
    }
}

/// The repository: the parent of this crate's directory (`bench/`).
fn repo_root() -> PathBuf {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR"));
    bench.parent().unwrap_or(bench).to_path_buf()
}
