//! `batcher policy ...`: the policy store ([policy_store] on) from the
//! command line. A policy is named `defaults`, by its key pattern
//! (`north-*`), or by its resource name (`policies/keys/north-*`).
//!
//! - `form`: names, the fields' forms (those of the config file and the
//!   history), changes between two versions, a config file's tables.
//! - `remote`: get, list, set, delete and history.
//! - `file`: import and diff of a config file's tables.

mod file;
mod form;
mod remote;

use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};

use super::client::CliError;
use super::{Pages, Remote};
use crate::policy::Overflow;
use crate::policy_store::FIELDS;

/// `batcher policy ...`.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Show one policy: the fields it sets, its revision, etag, and who
    /// wrote it when.
    Get {
        /// `defaults`, a key pattern (`north-*`) or `policies/...`.
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List policies: the defaults, then the key patterns by name (one
    /// page unless --all).
    List(ListArgs),
    /// Change the fields given (set or --unset) of a policy, creating it if
    /// need be; its other fields keep their values. Prints the policy.
    Set(Box<SetArgs>),
    /// Delete a key policy.
    Delete {
        /// A key pattern (`north-*`) or `policies/keys/...`.
        name: String,
        /// Delete it only if it still has this etag (from `get`).
        #[arg(long, default_value = "", hide_default_value = true)]
        etag: String,
        /// Why, for the history.
        #[arg(long, default_value = "", hide_default_value = true)]
        reason: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// The store's revisions, newest first: when, who, why, and each
    /// policy's action and changed fields (one page unless --all).
    History {
        /// Only revisions that changed this policy.
        name: Option<String>,
        #[command(flatten)]
        pages: Pages,
        #[command(flatten)]
        remote: Remote,
    },
    /// What `import FILE` would change, per policy and field
    /// (`field: store -> file`), without writing.
    Diff(DiffArgs),
    /// Write a config file's [defaults] and [keys."..."] tables to the
    /// store, as one revision.
    Import(ImportArgs),
}

/// `batcher policy list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only key patterns starting with this (the defaults only without it).
    #[arg(long, default_value = "")]
    pub prefix: String,
    #[command(flatten)]
    pub pages: Pages,
    #[command(flatten)]
    pub remote: Remote,
}

/// `batcher policy set`: one flag per field of a config file's table.
#[derive(Args, Debug)]
pub struct SetArgs {
    /// `defaults`, a key pattern (`north-*`) or `policies/...`.
    pub name: String,
    /// Flush when a group holds this many items.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_items: Option<u32>,
    /// Flush a group this long after it opened (`90s`, `2h`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_wait: Option<prost_types::Duration>,
    /// Flush before a group's payloads exceed this (`1048576`, `64KiB`, `1MB`).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub max_bytes: Option<u64>,
    /// Flush a group this long after its last add.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_idle: Option<prost_types::Duration>,
    /// The most a measure may sum to in a group, as NAME=VALUE; repeatable
    /// (or comma-separated), and it replaces the whole capacity. `none`: no
    /// limits (not the defaults').
    #[arg(long, value_name = "NAME=VALUE", value_delimiter = ',', value_parser = parse_limit)]
    pub capacity: Vec<Limit>,
    /// Local departure times, comma-separated (`11:30,17:45`).
    #[arg(long, value_name = "HH:MM,...", value_parser = parse_cutoffs)]
    pub cutoffs: Option<CutoffList>,
    /// The IANA time zone of the cutoffs (`Europe/Berlin`).
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,
    /// Flush this long before the earliest item deadline.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub deadline_lead: Option<prost_types::Duration>,
    /// Hold a timed-out group until it has this many items (needs max_age).
    #[arg(long, value_name = "N")]
    pub min_items: Option<u32>,
    /// Flush a held group at this age whatever its size.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_age: Option<prost_types::Duration>,
    /// The most groups the policy's keys hold open at once (0: no limit).
    #[arg(long, value_name = "N")]
    pub max_groups: Option<u32>,
    /// What an add does that would open a group past max_groups or
    /// [limits] max_open_groups.
    #[arg(long, value_name = "WHAT", value_parser = PossibleValuesParser::new([Overflow::Refuse, Overflow::FlushOldest].map(Overflow::as_str)))]
    pub overflow: Option<String>,
    /// Clear a field (a key policy then takes the defaults'); repeatable.
    #[arg(long, value_name = "FIELD", value_delimiter = ',', value_parser = PossibleValuesParser::new(FIELDS))]
    pub unset: Vec<String>,
    /// Change it only if it still has this etag (from `get`); `0`: only
    /// create it.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub etag: String,
    /// Why, for the history.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    #[command(flatten)]
    pub remote: Remote,
}

/// `batcher policy import`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// A config file (only its [defaults] and [keys."..."] tables are read).
    pub file: PathBuf,
    /// Also delete the key policies the file does not have.
    #[arg(long)]
    pub prune: bool,
    /// Why, for the history (default: "batcher policy import FILE").
    #[arg(long)]
    pub reason: Option<String>,
    /// Import only if the store is still at this revision (as `diff`
    /// printed it); ABORTED otherwise.
    #[arg(long, value_name = "REVISION", default_value_t = 0)]
    pub expect_revision: u64,
    #[command(flatten)]
    pub remote: Remote,
}

/// `batcher policy diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// A config file (only its [defaults] and [keys."..."] tables are read).
    pub file: PathBuf,
    /// Also show the key policies `import --prune` would delete.
    #[arg(long)]
    pub prune: bool,
    /// Exit 1 when there are differences (0 when there are none).
    #[arg(long)]
    pub exit_code: bool,
    #[command(flatten)]
    pub remote: Remote,
}

/// One `--capacity` value: a limit, or `None` for `none`.
#[derive(Clone, Debug)]
pub struct Limit(pub Option<(String, u64)>);

/// `--cutoffs`, checked and written as the store writes them.
#[derive(Clone, Debug)]
pub struct CutoffList(pub Vec<String>);

/// Runs a `batcher policy` command.
pub async fn run(command: PolicyCommand) -> Result<(), CliError> {
    match command {
        PolicyCommand::Get { name, remote } => remote::get(&remote, &name).await,
        PolicyCommand::List(args) => remote::list(args).await,
        PolicyCommand::Set(args) => remote::set(*args).await,
        PolicyCommand::Delete {
            name,
            etag,
            reason,
            remote,
        } => remote::delete(&remote, &name, etag, reason).await,
        PolicyCommand::History {
            name,
            pages,
            remote,
        } => remote::history(&remote, &pages, name.as_deref()).await,
        PolicyCommand::Diff(args) => file::diff(args).await,
        PolicyCommand::Import(args) => file::import(args).await,
    }
}

/// A duration as the config file writes one (`90s`, `2h 30m`).
fn parse_duration(text: &str) -> Result<prost_types::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    prost_types::Duration::try_from(d).map_err(|e| e.to_string())
}

/// A byte count: a number, or one with a unit (`64KiB`, `1MB`).
fn parse_bytes(text: &str) -> Result<u64, String> {
    let bytes = text.parse::<bytesize::ByteSize>();
    bytes
        .map(|b| b.as_u64())
        .map_err(|e| format!("{text:?}: {e}"))
}

/// `NAME=VALUE`, or `none`.
fn parse_limit(text: &str) -> Result<Limit, String> {
    if text == "none" {
        return Ok(Limit(None));
    }
    super::parse_measure(text).map(|limit| Limit(Some(limit)))
}

/// `HH:MM[:SS]` times, comma-separated, checked as the config file's.
fn parse_cutoffs(text: &str) -> Result<CutoffList, String> {
    let times: Vec<String> = text.split(',').map(|t| t.trim().to_owned()).collect();
    let checked = crate::config::CutoffTimes::try_from(times)?;
    Ok(CutoffList(checked.into()))
}
