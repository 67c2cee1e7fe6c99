//! `batcher-bench`: the benchmark harness of batcher.
//!
//! ```sh
//! cargo run --release --bin batcher-bench              # full run, writes BENCHMARKS.md
//! cargo run --release --bin batcher-bench -- --quick   # smoke run (CI), well under 2 minutes
//! cargo run --release --bin batcher-bench -- --only 3,4
//! cargo run --bin batcher-bench -- instructions --check bench/instructions.toml   # CI
//! ```
//!
//! By default it starts its own `redis-server` (free loopback port, temporary
//! directory, no persistence) and runs the service as a child process (this
//! binary re-executed with the hidden `__serve` subcommand), so the service's
//! RSS and CPU time can be read apart from the load generator's. A fresh
//! service is started for each scenario, after a FLUSHALL of the bench's own
//! Redis. `--redis-url` and `--service` target given ones instead; an external
//! Redis is never flushed (every key and id carries a per-run tag), and an
//! external service must run the config `--print-config` prints. Every child
//! is killed when the bench exits, panics, or is interrupted. The exit status
//! is 0 whatever the figures; it is 1 only if a scenario could not run at all.
//!
//! Redis, the service and the load generator share the machine, so the
//! throughputs are reference figures of this machine and run. Two yardsticks
//! our code cannot move judge them instead: `bench/peer/run` compares
//! throughput and Redis CPU per item with BullMQ's in the same sitting, and
//! `batcher-bench instructions` counts the Redis instructions per item
//! (`instructions/`; CI fails when a shape of ours rises more than 3% above
//! `bench/instructions.toml`).
//!
//! # Scenarios
//!
//! Each module's doc says what its scenario does; `method.rs` says how each
//! figure is computed (BENCHMARKS.md's "How each figure is computed"), and
//! `runner.rs` runs them in order.
//! - 1, 2 (`ingest.rs`): AddMany and unary Add, rate and CPU per item; rows
//!   1c and 2c run the same load against the frozen service floors
//!   (`floor_serve_many.rs`, `floor_serve.rs`).
//! - 3 (`precision.rs`): timeout lateness. 4 (`fanout.rs`): flush to 100
//!   subscribers. 5–7 (`scale.rs`): Add latency, Redis memory and service RSS
//!   over 1k and 1M open groups. 8 (`remembered.rs`): memory per remembered id.
//! - 9 (`cluster.rs`, `cluster_report.rs`): AddMany on a 3-master cluster.
//!   10 (`overload.rs`): open-loop AddMany at twice the capacity. 11
//!   (`policies.rs`): every policy rule on. 12 (`calls.rs`): adds per call.
//!   13 (`policy_store.rs`): the policy store at 100k areas. 14
//!   (`tracing_cost.rs`): tracing on.
//!
//! # Layout
//!
//! Beside the scenarios: `service.rs` (the config under test and a fresh
//! service per scenario), `serve.rs` (the hidden `__serve`), `scenarios.rs`
//! (what they share), `load.rs` (load generation), `procs.rs` (child
//! processes, started with the `batcher-testkit` crate the integration tests
//! use too; CPU and RSS), `store_load.rs` (the hidden `__store_load`: our add
//! path without the service, for `bench/peer/run`), `reports.rs` (results to
//! rows and notes), `report.rs` (the table and BENCHMARKS.md) and `charts/`
//! (its SVG charts, drawn with plotters into `bench/` beside BENCHMARKS.md in
//! a full run, `target/bench-quick/` with `--quick` and `target/bench-partial/`
//! with `--only`).

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
        Some(Command::FloorServeMany { redis_url }) => {
            let future = floor_serve_many::serve(&redis_url);
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
