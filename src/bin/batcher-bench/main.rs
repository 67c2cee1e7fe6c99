//! `batcher-bench`: the benchmark harness of batcher (issue 4).
//!
//! ```sh
//! cargo run --release --bin batcher-bench              # full run, writes BENCHMARKS.md
//! cargo run --release --bin batcher-bench -- --quick   # smoke run (CI), well under 2 minutes
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
//! is killed when the bench exits, panics, or is interrupted.
//!
//! Redis, the service and the load generator share the machine, so throughput
//! is reported next to a ceiling measured in the same run, as a ratio. The
//! exit status is 0 whatever the figures; it is 1 only if a scenario could
//! not run at all.
//!
//! # Ceiling
//! `redis-benchmark` with 50 clients runs `EVALSHA` of the service's own add
//! script (`batcher::scripts::ADD_ITEMS`) with the exact argument list
//! `batcher::store::AddArgs` builds for one item, once without pipelining and once
//! with `-P 16`, each sized by a short calibration run to last about 5 s
//! (quick: 1.5 s). Figure: calls per second, which is items per second. See
//! `ceiling.rs` for how keys and ids vary and how every call is checked to add.
//!
//! # Scenarios
//! 1. **Ingest through AddMany.** 16 callers over 4 HTTP/2 connections send
//!    AddMany calls of 100 items, each under one of 10k keys at random
//!    (policy: max_items 10), for 10 s (quick: 2 s) after a 1 s warm-up.
//!    Figure: items added by calls that completed inside the window, divided
//!    by the window. Target: ≥ 1.0× the pipelined ceiling.
//! 2. **Ingest through unary Add.** The same with 64 callers over 8
//!    connections, one item per call. Figure: adds per second, and call
//!    latency p50/p99. Target: ≥ 0.5× the unpipelined ceiling.
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
//!    probe). Figure: p99 Add latency at 1M / at 1k. Target: ≤ 1.25.
//! 6. **Redis memory per open group.** Redis `used_memory` after opening the
//!    groups from 1k to 1M, minus before, divided by the groups opened (one
//!    item each: 15-byte key, 25-byte id, 32-byte payload). Target: ≤ 400 bytes.
//! 7. **Service RSS.** VmRSS of a fresh service after the probe, over 1k and
//!    over 1M open groups: the same history, so a difference could only be
//!    state held per open group. Also reported: the RSS of the service that
//!    opened the 1M groups, after its probe, and the peak RSS while streaming
//!    to 100 subscribers (scenario 4, sampled every 100 ms). Target: RSS must
//!    not grow with open groups; held when RSS at 1M ≤ 1.25× RSS at 1k.

mod ceiling;
mod load;
mod procs;
mod report;
mod scenarios;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use batcher::config::Config;
use batcher::pb;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use tokio_util::sync::CancellationToken;

use procs::{RedisServer, ServiceProc};
use report::{Row, Verdict};
use scenarios::{Sizes, Target};

#[derive(Parser)]
#[command(about = "Benchmarks batcher against its own Lua script on raw Redis")]
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
    /// target/BENCHMARKS.partial.md].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Run only these scenarios (comma-separated: ceiling,1,2,3,4,5,6,7;
    /// 5, 6 and 7 run together), e.g. to profile one of them.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Vec<String>,
    /// Print the service config the bench runs, and exit.
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Hidden>,
}

#[derive(Subcommand)]
enum Hidden {
    /// Runs the service under test (the bench starts itself with this).
    #[command(name = "__serve", hide = true)]
    Serve {
        #[arg(long)]
        config_toml: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Hidden::Serve { config_toml }) = args.command {
        return serve(&config_toml);
    }
    if args.print_config {
        let url = args
            .redis_url
            .as_deref()
            .unwrap_or("redis://127.0.0.1:6379");
        print!("{}", service_config(url));
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

/// The hidden `__serve` subcommand: the service under test, printing
/// `LISTENING <addr>` on stdout once it has bound its port.
fn serve(config_toml: &str) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match Config::parse(config_toml, "bench") {
        Ok(config) => config,
        Err(e) => {
            eprintln!("batcher-bench __serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("batcher-bench __serve: cannot listen: {e}");
                return ExitCode::FAILURE;
            }
        };
        match listener.local_addr() {
            Ok(addr) => println!("LISTENING {addr}"),
            Err(e) => {
                eprintln!("batcher-bench __serve: {e}");
                return ExitCode::FAILURE;
            }
        }
        let shutdown = CancellationToken::new();
        match batcher::server::run(listener, config, None, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("batcher-bench __serve: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The service config every scenario runs with. One config for all, with a
/// key glob per scenario policy, so that an external service can run it too.
fn service_config(redis_url: &str) -> String {
    let mut config = format!(
        r#"shutdown_grace = "1s"

[redis]
url = "{redis_url}"
prefix = "bench"
shards = 16

# Ingest (scenarios 1 and 2) and fan-out (scenario 4): groups flush by size.
# The wait is long so that groups left open by one scenario never time out
# during a later one.
[defaults]
max_items = 10
max_wait = "1h"

# Scale, memory and RSS (scenarios 5 to 7): one-item groups that stay open.
[keys."sc-*"]
max_items = 1000
max_wait = "1h"

# Timeout precision (scenario 3): one glob per wait, full and quick runs.
"#
    );
    let mut waits: Vec<Duration> = scenarios::precision_waits(false);
    waits.extend(scenarios::precision_waits(true));
    waits.sort();
    waits.dedup();
    for wait in waits {
        let ms = wait.as_millis();
        config += &format!("[keys.\"tp-{ms}-*\"]\nmax_wait = \"{ms}ms\"\n");
    }
    config
}

/// The Redis and service the scenarios run against, and how to renew them.
struct Env {
    redis_url: String,
    redis: Option<RedisServer>,
    external_service: Option<SocketAddr>,
    service: Option<ServiceProc>,
    config: String,
}

impl Env {
    /// A clean slate for a scenario: stops the previous service, empties the
    /// bench's own Redis when `flush`, and starts a fresh service. Must be
    /// awaited from the main future (it spawns a child).
    async fn fresh(&mut self, flush: bool) -> Result<Target, String> {
        self.service = None;
        if flush && self.redis.is_some() {
            let client = redis::Client::open(self.redis_url.as_str()).map_err(|e| e.to_string())?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("redis: {e}"))?;
            redis::cmd("FLUSHALL")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| format!("FLUSHALL: {e}"))?;
        }
        let (addr, service_pid) = match self.external_service {
            Some(addr) => (addr, None),
            None => {
                let service = ServiceProc::start(&self.config)?;
                let started = (service.addr, Some(service.pid()));
                self.service = Some(service);
                started
            }
        };
        wait_ready(addr).await?;
        Ok(Target {
            addr,
            service_pid,
            redis_pid: self.redis.as_ref().map(RedisServer::pid),
            redis_url: self.redis_url.clone(),
        })
    }
}

/// Waits until the service answers a call that reaches Redis.
async fn wait_ready(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        match load::connect(addr).await {
            Ok(mut client) => {
                let request = pb::GetGroupRequest {
                    key: "bench-ready".into(),
                };
                match client.get_group(request).await {
                    Ok(_) => return Ok(()),
                    Err(status) => last = status.message().to_string(),
                }
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("the service at {addr} is not ready: {last}"))
}

/// The table rows and notes collected so far, and whether any scenario could
/// not run.
struct Runner {
    rows: Vec<Row>,
    notes: Vec<String>,
    failed: bool,
    /// Scenario ids given to --only; empty for all.
    only: Vec<String>,
}

impl Runner {
    fn wants(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == id)
    }

    /// Records a scenario that could not run, as a NOT RUN row.
    fn not_run(&mut self, name: &str, error: &str) {
        eprintln!("batcher-bench: {name} could not run: {error}");
        self.failed = true;
        self.rows.push(Row::not_run(name, error));
    }

    /// The target of a scenario, or a NOT RUN row when it could not be set up.
    fn setup(&mut self, name: &str, target: Result<Target, String>) -> Option<Target> {
        target.map_err(|e| self.not_run(name, &e)).ok()
    }

    /// Runs a scenario with a time limit; a failure becomes a NOT RUN row.
    async fn attempt<T>(
        &mut self,
        name: &str,
        limit: Duration,
        future: impl Future<Output = Result<T, String>>,
    ) -> Option<T> {
        eprintln!("batcher-bench: {name} ...");
        let started = Instant::now();
        let result = match tokio::time::timeout(limit, future).await {
            Ok(result) => result,
            Err(_) => Err(format!("did not finish within {} s", limit.as_secs())),
        };
        match result {
            Ok(value) => {
                eprintln!(
                    "batcher-bench: {name} done in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                Some(value)
            }
            Err(e) => {
                self.not_run(name, &e);
                None
            }
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn ratio(value: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        value / reference
    } else {
        f64::NAN
    }
}

/// "0.53×" and PASS when `value` is at least `factor` times `reference`.
fn versus(value: f64, reference: Option<f64>, factor: f64) -> (String, Verdict) {
    match reference {
        Some(reference) => {
            let r = ratio(value, reference);
            (format!("{r:.2}×"), Verdict::of(r >= factor))
        }
        None => ("n/a (no ceiling)".to_string(), Verdict::Info),
    }
}

/// Runs every scenario (or those --only names), prints the table and writes the report.
async fn bench(args: Args) -> ExitCode {
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    let sizes = Sizes::new(args.quick);
    let run_tag = format!(
        "{:04x}",
        (std::process::id() ^ (load::now_micros() as u32)) & 0xffff
    );
    let mut runner = Runner {
        rows: Vec::new(),
        notes: Vec::new(),
        failed: false,
        only: args.only.clone(),
    };

    let redis = match &args.redis_url {
        Some(_) => None,
        None => match RedisServer::start().await {
            Ok(redis) => Some(redis),
            Err(e) => {
                eprintln!("batcher-bench: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let redis_url = args
        .redis_url
        .clone()
        .or_else(|| redis.as_ref().map(|r| r.url.clone()))
        .expect("a Redis URL");
    let config_text = service_config(&redis_url);
    let config = match Config::parse(&config_text, "bench") {
        Ok(config) => config,
        Err(e) => {
            eprintln!("batcher-bench: the bench's own config is invalid: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut env = Env {
        redis_url: redis_url.clone(),
        redis,
        external_service: args.service,
        service: None,
        config: config_text.clone(),
    };
    let redis_pid = env.redis.as_ref().map(RedisServer::pid);
    let redis_version = redis_version(&redis_url).await;
    if env.redis.is_none() {
        runner.notes.push(format!(
            "Redis was external ({redis_url}): it was not flushed between scenarios, so \
             memory and latency figures include whatever else it holds."
        ));
    }

    let mut ceiling = None;
    if runner.wants("ceiling") {
        let script_args = ceiling::ScriptArgs {
            policy: config.policies().resolve(&load::key("am", &run_tag, 0)),
            dedup: config.dedup.window,
        };
        let seconds = if args.quick { 1.5 } else { 5.0 };
        let run = ceiling::run(&redis_url, redis_pid, &script_args, seconds, &run_tag);
        ceiling = runner
            .attempt("ceiling (redis-benchmark)", Duration::from_secs(120), run)
            .await;
        if let Some(c) = &ceiling {
            report_ceiling(&mut runner, c);
        }
    }
    let unpipelined = ceiling.as_ref().map(|c| c.unpipelined.ops_per_sec);
    let pipelined = ceiling.as_ref().map(|c| c.pipelined.ops_per_sec);

    let name = "1. ingest via AddMany (100 items/call, 10k keys)";
    if runner.wants("1")
        && let Some(target) = runner.setup(name, env.fresh(true).await)
    {
        let run = scenarios::ingest_add_many(&target, &sizes, &run_tag);
        if let Some(r) = runner.attempt(name, Duration::from_secs(120), run).await {
            let per_sec = r.stats.per_sec();
            let (ratio, verdict) = versus(per_sec, pipelined, 1.0);
            runner.rows.push(Row::new(
                name,
                format!("{per_sec:.0} items/s"),
                "≥ 1.0× pipelined ceiling",
                ratio,
                verdict,
            ));
            runner.notes.push(format!(
                "1. AddMany: {} items in {:.0} s, call latency p50 {:.1} ms, p99 {:.1} ms; \
                 CPU {}{}.",
                r.stats.added,
                r.stats.window.as_secs_f64(),
                load::ms(&r.stats.latency, 0.5),
                load::ms(&r.stats.latency, 0.99),
                r.cpu,
                r.stats.error_note()
            ));
        }
    }

    let name = "2. ingest via unary Add (64 callers)";
    if runner.wants("2")
        && let Some(target) = runner.setup(name, env.fresh(true).await)
    {
        let run = scenarios::ingest_add(&target, &sizes, &run_tag);
        if let Some(r) = runner.attempt(name, Duration::from_secs(120), run).await {
            let per_sec = r.stats.per_sec();
            let (ratio, verdict) = versus(per_sec, unpipelined, 0.5);
            runner.rows.push(Row::new(
                name,
                format!(
                    "{per_sec:.0} adds/s (p50 {:.1} ms, p99 {:.1} ms)",
                    load::ms(&r.stats.latency, 0.5),
                    load::ms(&r.stats.latency, 0.99)
                ),
                "≥ 0.5× unpipelined ceiling",
                ratio,
                verdict,
            ));
            runner.notes.push(format!(
                "2. Add: {} adds in {:.0} s; CPU {}{}.",
                r.stats.added,
                r.stats.window.as_secs_f64(),
                r.cpu,
                r.stats.error_note()
            ));
        }
    }

    let name = format!(
        "3. timeout lateness ({}k groups, due over {} s)",
        sizes.precision_groups / 1000,
        sizes.precision_waits.len() as u64 * sizes.precision_waits[0].as_secs()
    );
    if runner.wants("3")
        && let Some(target) = runner.setup(&name, env.fresh(true).await)
    {
        let run = scenarios::timeout_precision(&target, &sizes, &run_tag);
        if let Some(r) = runner.attempt(&name, Duration::from_secs(180), run).await {
            report_precision(&mut runner, &name, &r);
        }
    }

    let name = "4. flush-to-subscriber latency (100 subscribers)";
    let mut streaming_rss = None;
    if runner.wants("4")
        && let Some(target) = runner.setup(name, env.fresh(true).await)
    {
        let run = scenarios::fanout(&target, &sizes, &run_tag);
        if let Some(r) = runner.attempt(name, Duration::from_secs(120), run).await {
            let p99 = load::ms(&r.latency, 0.99);
            runner.rows.push(Row::new(
                name,
                format!("p50 {:.1} ms, p99 {p99:.1} ms", load::ms(&r.latency, 0.5)),
                "p99 ≤ 5 ms",
                "",
                Verdict::of(p99 <= 5.0),
            ));
            runner.notes.push(format!(
                "4. Fan-out: {} batches × {} subscribers, {} of {} deliveries received, max \
                 latency {:.1} ms; CPU {}{}.",
                r.batches,
                r.subscribers,
                r.delivered,
                r.batches * r.subscribers as u64,
                r.latency.max() as f64 / 1000.0,
                r.cpu,
                r.errors
            ));
            streaming_rss = r.rss_max_kib;
        }
    }

    let name = format!(
        "5. Add latency p99, {}k vs 1k open groups",
        sizes.scale_large / 1000
    );
    if ["5", "6", "7"].iter().any(|id| runner.wants(id)) {
        let run = scale(&mut env, &sizes, &run_tag);
        if let Some(r) = runner.attempt(&name, Duration::from_secs(300), run).await {
            report_scale(&mut runner, &name, &r, streaming_rss);
        }
    }
    env.service = None;

    // Report.
    let (rows, notes) = (&runner.rows, &runner.notes);
    println!("\n{}", report::text_table(rows));
    for note in notes {
        println!("- {note}");
    }
    let command = command_line();
    let machine = report::Machine::detect();
    let out = args.out.clone().unwrap_or_else(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        if args.quick {
            root.join("target").join("BENCHMARKS.quick.md")
        } else if !args.only.is_empty() {
            root.join("target").join("BENCHMARKS.partial.md")
        } else {
            root.join("BENCHMARKS.md")
        }
    });
    let document = report::Document {
        rows,
        notes,
        machine: &machine,
        load_before: &load_before,
        command: &command,
        date: &report::utc_now(),
        mode: if args.quick {
            "quick (smoke run; small sizes)"
        } else {
            "full"
        },
        redis_version: &redis_version,
        commit: &git_commit(),
        config: &config_text.replace(&redis_url, "<the bench's own redis-server>"),
        method: METHOD,
    };
    if let Some(dir) = out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut failed = runner.failed;
    match std::fs::write(&out, document.render()) {
        Ok(()) => println!(
            "\nwrote {} ({:.0} s in all)",
            out.display(),
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            eprintln!("batcher-bench: cannot write {}: {e}", out.display());
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The two ceiling rows, and their commands and checks in the notes.
fn report_ceiling(runner: &mut Runner, c: &ceiling::Ceiling) {
    for (label, run) in [("no pipelining", &c.unpipelined), ("-P 16", &c.pipelined)] {
        runner.rows.push(Row::new(
            format!("ceiling: EVALSHA add_items, 50 clients, {label}"),
            format!("{:.0} calls/s", run.ops_per_sec),
            "reference",
            "",
            Verdict::Info,
        ));
        let check = if run.added == run.issued {
            "every call added its item".to_string()
        } else {
            format!("only {} of {} calls added an item", run.added, run.issued)
        };
        runner.notes.push(format!(
            "Ceiling, {label}: {:.0} calls/s over {} calls ({check}); CPU {}. Command: `{}`",
            run.ops_per_sec,
            run.issued,
            if run.cpu.is_empty() { "n/a" } else { &run.cpu },
            run.command
        ));
    }
}

fn report_precision(runner: &mut Runner, name: &str, r: &scenarios::Precision) {
    let (p50, p99, max) = (
        load::ms(&r.lateness, 0.5),
        load::ms(&r.lateness, 0.99),
        r.lateness.max() as f64 / 1000.0,
    );
    runner.rows.push(Row::new(
        name,
        format!(
            "p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms, missed {} of {}",
            r.missed, r.groups
        ),
        "p99 ≤ 5 ms, max ≤ 25 ms, none missed",
        "",
        Verdict::of(p99 <= 5.0 && max <= 25.0 && r.missed == 0),
    ));
    runner.notes.push(format!(
        "3. Timeout precision: {} groups opened in {:.1} s, {} batches received, \
         {} duplicate batches, {} early or non-TIMEOUT batches; CPU over the run {}{}.",
        r.groups, r.open_secs, r.received, r.duplicates, r.anomalies, r.cpu, r.open_errors
    ));
}

fn report_scale(runner: &mut Runner, name: &str, r: &ScaleResult, streaming_rss: Option<u64>) {
    let (small, large) = (
        load::ms(&r.probe_small.latency, 0.99),
        load::ms(&r.probe_large.latency, 0.99),
    );
    let scale_ratio = ratio(large, small);
    if runner.wants("5") {
        runner.rows.push(Row::new(
            name,
            format!("p99 {large:.2} ms vs {small:.2} ms"),
            "ratio ≤ 1.25",
            format!("{scale_ratio:.2}×"),
            Verdict::of(scale_ratio <= 1.25),
        ));
    }
    let per_group = (r.memory_after as f64 - r.memory_before as f64) / (r.large - r.small) as f64;
    if runner.wants("6") {
        runner.rows.push(Row::new(
            "6. Redis memory per open group",
            format!("{per_group:.0} bytes"),
            "≤ 400 bytes",
            "",
            Verdict::of(per_group <= 400.0),
        ));
    }
    let name = format!("7. service RSS, {}k vs 1k open groups", r.large / 1000);
    match (r.rss_small, r.rss_large) {
        _ if !runner.wants("7") => {}
        (Some(rss_small), Some(rss_large)) => {
            let rss_ratio = ratio(rss_large as f64, rss_small as f64);
            runner.rows.push(Row::new(
                name,
                format!(
                    "{} vs {}; {} after ingesting them; {} streaming to 100 subscribers",
                    mib(rss_large),
                    mib(rss_small),
                    r.rss_after_ingest.map_or("n/a".into(), mib),
                    streaming_rss.map_or("n/a".into(), mib)
                ),
                "must not grow with open groups (≤ 1.25×)",
                format!("{rss_ratio:.2}×"),
                Verdict::of(rss_ratio <= 1.25),
            ));
        }
        _ => runner.rows.push(Row::new(
            name,
            "n/a (external service)",
            "report",
            "",
            Verdict::Info,
        )),
    }
    let p50 = |p: &Probe| load::ms(&p.latency, 0.5);
    let p99 = |p: &Probe| load::ms(&p.latency, 0.99);
    runner.notes.push(format!(
        "5-7. Groups {}k → {}k opened at {:.0} groups/s (CPU {}). Add latency on a fresh \
         service: p50 {:.2} ms, p99 {:.2} ms at 1k; p50 {:.2} ms, p99 {:.2} ms at {}k. On the \
         service that had just opened them: p50 {:.2} ms, p99 {:.2} ms. Redis time per script \
         call (add or remove) during these probes: {:.1} µs, {:.1} µs, {:.1} µs. Redis \
         used_memory {:.1} MiB → {:.1} MiB.",
        r.small / 1000,
        r.large / 1000,
        r.fill_per_sec,
        r.fill_cpu,
        p50(&r.probe_small),
        p99(&r.probe_small),
        p50(&r.probe_large),
        p99(&r.probe_large),
        r.large / 1000,
        p50(&r.probe_after_ingest),
        p99(&r.probe_after_ingest),
        r.probe_small.redis_us_per_call,
        r.probe_large.redis_us_per_call,
        r.probe_after_ingest.redis_us_per_call,
        r.memory_before as f64 / 1048576.0,
        r.memory_after as f64 / 1048576.0,
    ));
}

/// What scenarios 5 to 7 measured.
struct ScaleResult {
    small: usize,
    large: usize,
    /// Add latency (µs) of the probe on a fresh service over `small` and over
    /// `large` open groups: the same service history, so the number of open
    /// groups is the only difference.
    probe_small: Probe,
    probe_large: Probe,
    /// The probe on the service that had just opened the `large` groups.
    probe_after_ingest: Probe,
    /// Redis used_memory before and after opening `large - small` groups.
    memory_before: u64,
    memory_after: u64,
    /// RSS of a fresh service after a probe, over `small` and over `large`
    /// open groups: the same history, so any difference is per-group state.
    rss_small: Option<u64>,
    rss_large: Option<u64>,
    /// RSS of the service that opened the groups, after its probe.
    rss_after_ingest: Option<u64>,
    fill_per_sec: f64,
    fill_cpu: String,
}

/// A probe's Add latency, and the Redis time per script call meanwhile, which
/// tells Redis's share of a latency change from the rest of the path.
struct Probe {
    latency: Histogram<u64>,
    redis_us_per_call: f64,
}

async fn probe(target: &Target, run: &str, round: char, total: usize) -> Result<Probe, String> {
    let (calls, usec) = scenarios::script_stats(&target.redis_url).await?;
    let latency = scenarios::probe(target, run, round, total).await?;
    let (calls_after, usec_after) = scenarios::script_stats(&target.redis_url).await?;
    Ok(Probe {
        latency,
        redis_us_per_call: (usec_after - usec) as f64 / (calls_after - calls).max(1) as f64,
    })
}

/// Scenarios 5 to 7 on one growing set of groups: open 1k; on a fresh
/// service, probe and read RSS; open up to 1M with Redis memory read around
/// it and probe again on that service; then probe and read RSS on another
/// fresh service. Restarts the service, so it runs on the main future (see
/// procs.rs).
async fn scale(env: &mut Env, sizes: &Sizes, run: &str) -> Result<ScaleResult, String> {
    let (small, large) = (sizes.scale_small, sizes.scale_large);
    let target = env.fresh(true).await?;
    scenarios::open_groups(&target, 0..small, run, 10).await?;

    let target = env.fresh(false).await?;
    let probe_small = probe(&target, run, 'p', sizes.probes).await?;
    let rss_small = target.rss();
    let memory_before = scenarios::used_memory(&target.redis_url).await?;
    let (fill_per_sec, fill_cpu) = scenarios::open_groups(&target, small..large, run, 16).await?;
    let memory_after = scenarios::used_memory(&target.redis_url).await?;
    let probe_after_ingest = probe(&target, run, 'q', sizes.probes).await?;
    let rss_after_ingest = target.rss();

    let target = env.fresh(false).await?;
    let probe_large = probe(&target, run, 'r', sizes.probes).await?;
    let rss_large = target.rss();
    Ok(ScaleResult {
        small,
        large,
        probe_small,
        probe_large,
        probe_after_ingest,
        memory_before,
        memory_after,
        rss_small,
        rss_large,
        rss_after_ingest,
        fill_per_sec,
        fill_cpu,
    })
}

/// The command that reproduces this run.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect();
    if args.is_empty() {
        "cargo run --release --bin batcher-bench".into()
    } else {
        format!(
            "cargo run --release --bin batcher-bench -- {}",
            args.join(" ")
        )
    }
}

/// `git describe --always --dirty` of the repository, or "unknown".
fn git_commit() -> String {
    std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The server's version, from INFO server.
async fn redis_version(url: &str) -> String {
    let version = async {
        let client = redis::Client::open(url).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(|v| v.trim().to_string())
    };
    version.await.unwrap_or_else(|| "unknown".into())
}

/// The method section of BENCHMARKS.md (the module doc above has the details).
const METHOD: &str = "\
- **Ceiling**: `redis-benchmark -c 50` running `EVALSHA` of the service's own add script \
  (`batcher::scripts::ADD_ITEMS`) with the argument list `batcher::store::AddArgs` builds for one \
  item (KEYS: due set, stream, flushed set, group hash of one shard; ARGV: dedup window, 1 group, \
  key, max_items 10, max_wait, max_bytes 0, then group 1, a 25-byte id, a 32-byte payload), \
  without pipelining and with `-P 16`, on the same redis-server, in the same run. Keys range \
  over 10k values with `-r 10000`. redis-benchmark draws each `__rand_int__` independently, so \
  the group hash and the due-set member come from different draws: the hashes behave exactly \
  (10 items, then a SIZE flush), and ZADD/ZREM touch a due set of the same size. Every run \
  checks afterwards that every call added its item.
- **1. AddMany**: 16 callers, 4 HTTP/2 connections, calls of 100 items over 10k keys; items \
  added by calls completing in the window / window. Target ≥ 1.0× the `-P 16` ceiling.
- **2. Add**: 64 callers, 8 connections, one item per call over 10k keys; adds per second. \
  Target ≥ 0.5× the unpipelined ceiling.
- **3. Timeout lateness**: one-item groups opened evenly within 5 s under 12 globs with \
  max_wait 5 s, 10 s … 60 s, so due times spread over 60 s (quick: 5k groups, 5 globs, \
  1 s … 5 s); lateness = `flushed_at − (opened_at + max_wait)` on the Redis clock, in whole \
  ms, from a Subscribe stream; missed = no batch within 5 s of the last due time.
- **4. Flush to subscriber**: 100 subscribers on their own connections; 100 size-flushes per \
  second; latency = receive time (host clock) − `flushed_at` (Redis clock, same host, whole \
  ms, so figures overstate by up to 1 ms), over every delivery.
- **5. Scale**: 4 probers each Add one item under a fresh key (opening a group) and Remove \
  it, so the number of open groups stays put; p99 Add latency with 1M open one-item groups \
  (quick: 20k) over p99 with 1k, each on a freshly started service.
- **6. Memory**: (Redis `used_memory` after opening the groups from 1k to 1M − before) / groups \
  opened; each group holds one item: 15-byte key, 25-byte id, 32-byte payload.
- **7. RSS**: VmRSS of a freshly started service after the same probe, over 1k and over 1M \
  open groups (same history, so a difference would be per-group state); also the RSS of the \
  service that ingested the 1M groups, and the peak while streaming to the 100 subscribers of \
  scenario 4.
- CPU figures are the user+system time of each process over the measured window, in percent \
  of one core.
";
