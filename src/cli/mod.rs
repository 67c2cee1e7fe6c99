//! The operator CLI: the `batcher` subcommands other than `serve`. Each one
//! makes one or a few gRPC calls to a running service (`--addr`, a bearer
//! `--token`, TLS flags) and prints aligned tables for people or, with
//! `--json`, the protobuf JSON mapping, one object per line, for scripts.
//! `config check` validates a config file offline, with `serve`'s errors.
//!
//! Exit codes: 0 on success, 1 on an error (the gRPC code and message go to
//! stderr) or on differences found by `policy diff --exit-code`, 2 on a
//! usage error (from clap).
//!
//! - `client`: connecting (address, TLS, token) and describing errors.
//! - `commands`: the one-shot commands.
//! - `output`: tables, times and the JSON lines.
//! - `policy`: `batcher policy ...`, the policy store's commands.
//! - `tail`: the streaming `tail`, which reconnects on a dropped stream.

mod client;
mod commands;
mod output;
mod policy;
mod tail;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

pub use self::client::{Bearer, CliError, DEFAULT_ADDR};
pub use self::policy::PolicyCommand;

/// The client subcommands, flattened into the binary's `Command` beside `serve`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Add one item to the open group of KEY.
    Add(AddArgs),
    /// Show the open group of KEY, with its items.
    Get {
        /// The group's key.
        key: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List open groups, soonest due first (one page unless --all).
    List(ListArgs),
    /// Flush the open group of KEY now (reason MANUAL).
    Flush {
        /// The group's key.
        key: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Take item ID out of the open group of KEY.
    Remove {
        /// The group's key.
        key: String,
        /// The item's id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print flushed batches as they arrive, one line each, until Ctrl-C.
    Tail(TailArgs),
    /// List a consumer group's dead letters (one page unless --all).
    DeadLetters(DeadLettersArgs),
    /// Deliver dead-lettered batches to their consumer group again.
    Redrive {
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// Ids of dead-lettered batches.
        #[arg(required = true)]
        ids: Vec<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Put items of a delivered batch back into their key's open group.
    Requeue {
        /// The batch the items were delivered in.
        batch_id: String,
        /// Ids of items of that batch.
        #[arg(required = true)]
        item_ids: Vec<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Read and change the policy store ([policy_store] enabled): get,
    /// list, set, delete, history, and import or diff a config file.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

/// `batcher config ...`.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate a config file without starting, with the errors `serve` gives.
    Check {
        /// The TOML config file.
        file: PathBuf,
    },
}

/// Where the service is, how to reach it, and how to print.
#[derive(Args, Debug, Clone)]
pub struct Remote {
    /// The service's gRPC address: HOST:PORT, http://HOST:PORT or https://HOST:PORT.
    #[arg(long, env = "BATCHER_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// A bearer token, sent as `authorization: Bearer <token>`.
    #[arg(long, env = "BATCHER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speak TLS, trusting this CA (PEM) for the server's certificate.
    /// Without it, an https:// address trusts the system's roots.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Present this client certificate (PEM), for mutual TLS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name to check the server's certificate against (default: the address's host).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// How long to wait for a connection and for each answer (tail's stream excepted).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print the protobuf JSON mapping, one object per line.
    #[arg(long)]
    pub json: bool,
}

/// `batcher add`.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// The grouping key.
    pub key: String,
    /// The item's id, unique within the key.
    pub id: String,
    /// The payload, as text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// Read the payload from this file (`-` for stdin).
    #[arg(long, value_name = "PATH")]
    pub payload_file: Option<PathBuf>,
    /// A measure the item carries, as NAME=VALUE; repeatable.
    #[arg(long = "measure", value_name = "NAME=VALUE", value_parser = parse_measure)]
    pub measures: Vec<(String, u64)>,
    /// The latest time the item's batch may be flushed (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub deadline: Option<jiff::Timestamp>,
    /// Flush the group in the same step, with reason CLOSED.
    #[arg(long)]
    pub close: bool,
    #[command(flatten)]
    pub remote: Remote,
}

/// `batcher list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only groups whose key starts with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    #[command(flatten)]
    pub pages: Pages,
    #[command(flatten)]
    pub remote: Remote,
}

/// `batcher dead-letters`.
#[derive(Args, Debug)]
pub struct DeadLettersArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,
    #[command(flatten)]
    pub pages: Pages,
    #[command(flatten)]
    pub remote: Remote,
}

/// Paging of the list commands.
#[derive(Args, Debug)]
pub struct Pages {
    /// Most entries per page (the service reads 0 as 100 and caps it at 1000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub page_size: i32,
    /// Start at this page (the token the previous page printed).
    #[arg(long, default_value = "", conflicts_with = "all")]
    pub page_token: String,
    /// Follow every page to the end.
    #[arg(long)]
    pub all: bool,
}

/// `batcher tail`.
#[derive(Args, Debug)]
pub struct TailArgs {
    /// Only batches of this key; repeatable.
    #[arg(long = "key", value_name = "KEY")]
    pub keys: Vec<String>,
    /// Only batches whose key starts with this; repeatable.
    #[arg(long = "prefix", value_name = "PREFIX")]
    pub prefixes: Vec<String>,
    /// Start after this cursor ("0": the oldest retained batch). With
    /// --group it applies only when the group is created ("" or "0").
    #[arg(long, default_value = "")]
    pub after: String,
    /// Subscribe durably through this consumer group.
    #[arg(long, requires = "consumer")]
    pub group: Option<String>,
    /// This consumer's name within the group.
    #[arg(long, requires = "group")]
    pub consumer: Option<String>,
    /// With --group, do not ack the batches (they are redelivered).
    #[arg(long, requires = "group")]
    pub no_ack: bool,
    #[command(flatten)]
    pub remote: Remote,
}

/// Runs `command`; errors go to stderr as `batcher: ...`.
pub async fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Tail(args) => tail::run(args).await,
        Command::Config(ConfigCommand::Check { file }) => commands::config_check(&file),
        Command::Policy(command) => policy::run(command).await,
        command => commands::run(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `policy diff --exit-code`: the differences are on stdout already.
        Err(CliError::Differences) => ExitCode::FAILURE,
        // `batcher list | head`: the reader has gone, which is no error.
        Err(CliError::Output(err)) if err.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("batcher: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Parses `NAME=VALUE` for `--measure`.
fn parse_measure(text: &str) -> Result<(String, u64), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    let value = value
        .parse()
        .map_err(|e| format!("{value:?} is not a whole number: {e}"))?;
    Ok((name.to_owned(), value))
}
