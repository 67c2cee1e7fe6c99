//! The `batcher` binary: `serve` parses its arguments, reads the config,
//! sets up the logs, binds the listeners and runs the server; every other
//! subcommand is the operator CLI (`batcher::cli`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use batcher::config::{Config, LogFormat};
use batcher::drain::Drain;
use batcher::telemetry::Telemetry;
use clap::{Parser, Subcommand};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry;

#[derive(Parser)]
#[command(
    version,
    about = "Count-or-timeout batching aggregator on Redis, served over gRPC"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API.
    Serve {
        /// The TOML config file; built-in defaults when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides `listen` from the config.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Overrides `[http] listen` from the config (port 0 picks a free one).
        #[arg(long)]
        http_listen: Option<SocketAddr>,
    },
    #[command(flatten)]
    Client(Box<batcher::cli::Command>),
}

/// mimalloc: the service allocates and frees small buffers on every call,
/// where glibc's malloc costs about a seventh of its CPU.
/// Built without transparent huge pages (`no_thp` in Cargo.toml), which
/// halves the idle RSS at no cost in CPU (bench/sittings/10-32985c9.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let (path, listen, http_listen) = match Args::parse().command {
        Command::Serve {
            config,
            listen,
            http_listen,
        } => (config, listen, http_listen),
        Command::Client(command) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            return block_on(runtime, batcher::cli::run(*command));
        }
    };
    let config = match &path {
        Some(path) => match Config::load(path) {
            Ok(config) => config,
            Err(err) => {
                eprintln!("batcher: {err}");
                return ExitCode::FAILURE;
            }
        },
        None => Config::default(),
    };
    // The runtime's size is the config's, so the config is read first.
    let runtime = batcher::server::runtime(config.worker_threads().get());
    block_on(runtime, serve(config, path, listen, http_listen))
}

/// Runs `main` on `runtime`, or says why the runtime did not start.
fn block_on(
    runtime: std::io::Result<tokio::runtime::Runtime>,
    main: impl Future<Output = ExitCode>,
) -> ExitCode {
    match runtime {
        Ok(runtime) => runtime.block_on(main),
        Err(e) => {
            eprintln!("batcher: cannot start the tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves the gRPC API with `config` (read from `path`, which a SIGHUP
/// reads again), `listen` and `http_listen` overriding its listeners.
async fn serve(
    mut config: Config,
    path: Option<PathBuf>,
    listen: Option<SocketAddr>,
    http_listen: Option<SocketAddr>,
) -> ExitCode {
    // Traces over OTLP when the OTEL_* environment asks (docs/tracing.md).
    let telemetry = match Telemetry::from_env() {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("batcher: traces: {err}");
            return ExitCode::FAILURE;
        }
    };
    init_logs(config.log.format, telemetry.as_ref());
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if let Some(listen) = http_listen {
        config.http.listen = listen;
    }
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("batcher: cannot listen on {}: {err}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let http = match batcher::http::bind(&config.http).await {
        Ok(http) => http,
        Err(err) => {
            eprintln!(
                "batcher: [http] cannot listen on {}: {err}",
                config.http.listen
            );
            return ExitCode::FAILURE;
        }
    };
    let drain = Drain::new();
    tokio::spawn(drain_on_signals(drain.clone()));
    let grace = config.drain_timeout;
    let served = batcher::server::run_draining(listener, http, config, path, drain).await;
    if let Some(telemetry) = telemetry {
        telemetry.shutdown(grace).await;
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("batcher: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Writes log lines to stdout in `format`, at the levels `RUST_LOG` sets
/// (default `info,redis=error`); with `telemetry`, also turns this crate's
/// spans into OpenTelemetry spans, whatever `RUST_LOG` says.
fn init_logs(format: LogFormat, telemetry: Option<&Telemetry>) {
    // redis-rs's cluster client logs every failed reconnect while a node is
    // down, thousands a second; batcher logs the failures that reach it,
    // rate-limited. RUST_LOG=info,redis=warn brings them back.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,redis=error"));
    let Some(telemetry) = telemetry else {
        let logs = tracing_subscriber::fmt().with_env_filter(filter);
        return match format {
            LogFormat::Text => logs.init(),
            // One object per line, the event's fields at the top level.
            LogFormat::Json => logs.json().flatten_event(true).init(),
        };
    };
    use tracing_subscriber::prelude::*;
    let spans = Targets::new().with_target("batcher", tracing::Level::INFO);
    let traces = telemetry.layer().with_filter(spans);
    let logs = tracing_subscriber::fmt::layer();
    let spans = registry().with(traces);
    match format {
        LogFormat::Text => spans.with(logs.with_filter(filter)).init(),
        LogFormat::Json => spans
            .with(logs.json().flatten_event(true).with_filter(filter))
            .init(),
    }
}

/// Begins the drain on the first SIGTERM or SIGINT, and ends it at once on
/// a second.
async fn drain_on_signals(drain: Drain) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    let mut next = async || {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    };
    let first = next().await;
    tracing::info!(signal = first, "draining; a second signal stops at once");
    drain.begin();
    let second = next().await;
    tracing::warn!(signal = second, "a second signal: stopping at once");
    drain.abort();
}
