//! The Lua. Open groups are read and written by one library of Redis
//! Functions, the only code that knows a group's layout (format 4, see
//! `src/lua/layout.lua`) and decides when a group is due (on Redis `TIME`).
//! It is loaded once per node with `FUNCTION LOAD` and called with `FCALL`,
//! so a call runs only its function, not a script body that makes its
//! helpers anew. The durable subscriptions' three scripts (claim, ack,
//! redrive) touch no group and run by `EVALSHA`.
//!
//! The library is named by a hash of its code (`batcher_<hash>`), and so
//! are its functions, so that two versions of the service on one Redis
//! (a rolling upgrade) each call their own.

use std::sync::LazyLock;

use redis::Script;
use sha2::{Digest, Sha256};

use crate::batch::FlushReason;

/// The data format the library reads and writes; see [`crate::store::Store::check_format`].
pub const FORMAT: u32 = 4;

/// The library's files, in the order they are joined into its body.
const FILES: [&str; 7] = [
    include_str!("lua/layout.lua"),
    include_str!("lua/batches.lua"),
    include_str!("lua/limits.lua"),
    include_str!("lua/add.lua"),
    include_str!("lua/add_ruled.lua"),
    include_str!("lua/add_call.lua"),
    include_str!("lua/groups.lua"),
];

/// A function of the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// Adds items to the open groups of one shard (`add.lua`, `add_ruled.lua`,
    /// `add_call.lua`).
    Add,
    /// Adds items to the open groups of several shards of one Redis (not a
    /// cluster), one section per shard (`add_call.lua`).
    AddShards,
    /// Flushes one group, by due time or by request.
    Flush,
    /// Removes one item from its open group.
    Remove,
    /// Reads one open group.
    Group,
    /// Reads which groups of a shard are due.
    Due,
    /// Brings one open group under a shorter `max_wait`.
    Retime,
    /// Reads one shard's open-group index (limits on open groups).
    OpenStats,
}

impl Function {
    const ALL: [(Function, &'static str); 8] = [
        (Function::Add, "add"),
        (Function::AddShards, "add_shards"),
        (Function::Flush, "flush"),
        (Function::Remove, "remove"),
        (Function::Group, "group"),
        (Function::Due, "due"),
        (Function::Retime, "retime"),
        (Function::OpenStats, "open_stats"),
    ];

    /// Its name in Redis: `batcher_<verb>_<library hash>`.
    pub fn name(self) -> &'static str {
        let at = Self::ALL.iter().position(|(f, _)| *f == self).unwrap_or(0);
        &LIBRARY.names[at]
    }
}

/// The library's code, as `FUNCTION LOAD` takes it, and its functions' names.
pub struct Library {
    pub code: String,
    pub version: String,
    names: Vec<String>,
}

/// Registers the library's functions; see the file.
const REGISTRATION: &str = include_str!("lua/library.lua");

/// The library: a function `body` that holds the `REASON` table made from
/// the Rust table of flush reasons (so both languages name them from one
/// list) and the files, then the registration.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let body = [FlushReason::lua_table()]
        .into_iter()
        .chain(FILES.iter().map(|f| f.to_string()))
        .collect::<Vec<_>>()
        .join("\n");
    let body = format!("local function body()\n{body}\nend\n{REGISTRATION}");
    let version = hex::encode(&Sha256::digest(body.as_bytes())[..6]);
    let code = format!("#!lua name=batcher_{version}\nlocal VERSION = '{version}'\n{body}");
    let names = Function::ALL
        .iter()
        .map(|(_, verb)| format!("batcher_{verb}_{version}"))
        .collect();
    Library {
        code,
        version,
        names,
    }
});

/// Redelivers a consumer group's timed-out batches, or dead-letters them.
pub static CLAIM_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/claim_batches.lua")));

/// Acknowledges batches for a consumer group.
pub static ACK_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ack_batches.lua")));

/// Changes the policy store: documents, revision and history in one step.
pub static POLICY_UPDATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/policy_update.lua")));

/// Puts a bulk change of the policy store, staged beforehand, in force.
pub static POLICY_SWAP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/policy_swap.lua")));

/// Re-drives dead-lettered batches to their consumer group.
pub static REDRIVE_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/redrive_batches.lua")));
