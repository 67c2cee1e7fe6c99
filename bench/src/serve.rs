//! The hidden `__serve` subcommand: the service under test, which the bench
//! starts as a child of its own (see procs.rs).

use std::process::ExitCode;

use batcher::config::Config;
use tokio_util::sync::CancellationToken;

/// The hidden `__serve` subcommand: the service under test, printing
/// `LISTENING <addr>` on stdout once it has bound its port.
pub fn main(config_toml: &str) -> ExitCode {
    let config = match Config::parse(config_toml, "bench") {
        Ok(config) => config,
        Err(e) => {
            eprintln!("batcher-bench __serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The service's own runtime (see batcher::server::runtime).
    let runtime = batcher::server::runtime(config.worker_threads().get()).expect("tokio runtime");
    runtime.block_on(async {
        // Traces as `batcher serve` sends them, when OTEL_* asks (scenario 14).
        let telemetry = match batcher::telemetry::Telemetry::from_env() {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("batcher-bench __serve: traces: {e}");
                return ExitCode::FAILURE;
            }
        };
        serve_logs(telemetry.as_ref());
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
        let http = match batcher::http::bind(&config.http).await {
            Ok(http) => http,
            Err(e) => {
                eprintln!("batcher-bench __serve: [http] cannot listen: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = CancellationToken::new();
        let served = batcher::server::run(listener, http, config, None, shutdown).await;
        if let Some(telemetry) = telemetry {
            telemetry.shutdown(std::time::Duration::from_secs(1)).await;
        }
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("batcher-bench __serve: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The service's logs on stderr (stdout carries its address), at `warn`
/// unless RUST_LOG says otherwise; with `telemetry`, its spans too.
fn serve_logs(telemetry: Option<&batcher::telemetry::Telemetry>) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let traces = telemetry.map(|t| {
        let spans = tracing_subscriber::filter::Targets::new()
            .with_target("batcher", tracing_subscriber::filter::LevelFilter::INFO);
        t.layer().with_filter(spans)
    });
    tracing_subscriber::registry()
        .with(traces)
        .with(logs)
        .init();
}
