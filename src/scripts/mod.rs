//! The Lua. Open groups are read and written by one library of Redis
//! Functions, the only code that knows a group's layout (format 4,
//! described once, in [`layout`]) and decides when a group is due (on
//! Redis `TIME`).
//! It is loaded once per node with `FUNCTION LOAD` and called with `FCALL`,
//! so a call runs only its function, not a script body that makes its
//! helpers anew. The durable subscriptions' four scripts (claim, release,
//! ack, redrive) and the sinks' lease script touch no group and run by
//! `EVALSHA`.
//!
//! The library is named by a hash of its code (`batcher_<hash>`), and so
//! are its functions, so that two versions of the service on one Redis
//! (a rolling upgrade) each call their own.
//!
//! Rust owns every code, field byte and packed order the library shares
//! with the service: [`FlushReason`], [`layout::Field`], and those of
//! [`codes`]. The library's body starts with them as Lua tables of named
//! constants ([`PRELUDE`]), made from the Rust tables, so the Lua names
//! them and never spells their numbers.

use std::sync::LazyLock;

use redis::Script;
use sha2::{Digest, Sha256};

use crate::batch::FlushReason;

pub mod codes;
pub mod layout;

/// The data format the library reads and writes; see [`crate::store::Store::check_format`].
pub const FORMAT: u32 = 4;

/// The library's files, in the order they are joined into its body.
const FILES: [&str; 7] = [
    include_str!("../lua/layout.lua"),
    include_str!("../lua/batches.lua"),
    include_str!("../lua/limits.lua"),
    include_str!("../lua/add.lua"),
    include_str!("../lua/add_ruled.lua"),
    include_str!("../lua/add_call.lua"),
    include_str!("../lua/groups.lua"),
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
const REGISTRATION: &str = include_str!("../lua/library.lua");

/// The Lua tables of what the library shares with the service, made from
/// the Rust tables: `REASON` ([`FlushReason`]), `OUTCOME`, `LIMIT`,
/// `POLICY`, `OVERFLOW`, `HEADER`, `FLAG` ([`codes`]), `FIELD`, `BATCH` and
/// `SEP` ([`layout`]).
pub static PRELUDE: LazyLock<String> =
    LazyLock::new(|| [FlushReason::lua_table(), codes::lua(), layout::lua()].concat());

/// The library: the [`PRELUDE`] at its top level (so its tables count
/// against neither the locals of `body`, which Lua bounds at 200, nor a
/// call's time), a function `body` that holds the files, then the
/// registration.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let files = FILES.join("\n");
    let body = format!(
        "{}local function body()\n{files}\nend\n{REGISTRATION}",
        *PRELUDE
    );
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
    LazyLock::new(|| Script::new(include_str!("../lua/claim_batches.lua")));

/// Releases the batches a draining consumer holds, for its group's others.
pub static RELEASE_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/release_batches.lua")));

/// Acknowledges batches for a consumer group.
pub static ACK_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/ack_batches.lua")));

/// Changes the policy store: documents, revision and history in one step.
pub static POLICY_UPDATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/policy_update.lua")));

/// Puts a bulk change of the policy store, staged beforehand, in force.
pub static POLICY_SWAP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/policy_swap.lua")));

/// Takes, renews or gives up a sink's lease on a shard.
pub static TAKE_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/take_lease.lua")));

/// Re-drives dead-lettered batches to their consumer group; it writes a
/// batch's own fields, so it starts with the layout's tables ([`layout::lua`]).
pub static REDRIVE_BATCHES: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}{}",
        layout::lua(),
        include_str!("../lua/redrive_batches.lua")
    ))
});

#[cfg(test)]
mod tests {
    use super::codes::{HeaderSlot, ItemFlag, Limit, OVERFLOW, Outcome, PolicySlot};
    use super::layout::Field;
    use super::*;

    /// The Lua that the service runs and that is not generated: the
    /// library's files, its registration and the redrive script.
    fn sources() -> Vec<&'static str> {
        let mut all = FILES.to_vec();
        all.extend([REGISTRATION, include_str!("../lua/redrive_batches.lua")]);
        all
    }

    /// The names the Lua uses of table `table` (`TABLE.NAME`).
    fn used(table: &str) -> Vec<String> {
        let mark = format!("{table}.");
        let mut names = Vec::new();
        for source in sources() {
            for (at, _) in source.match_indices(&mark) {
                let before = source[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &source[at + mark.len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .unwrap_or(rest.len());
                names.push(rest[..end].to_owned());
            }
        }
        names
    }

    /// The Lua names of every table Rust owns: whether the Lua must use
    /// each of them.
    fn tables() -> Vec<(&'static str, Vec<&'static str>, bool)> {
        fn words<T: Copy>(all: &[(T, &'static str)]) -> Vec<&'static str> {
            all.iter().map(|(_, w)| *w).collect()
        }
        let fields = |group: bool| {
            let all = Field::ALL.iter().filter(|(f, _)| f.of_group() == group);
            all.map(|(_, w)| *w).collect()
        };
        vec![
            ("REASON", words(FlushReason::ALL), false),
            ("OUTCOME", words(&Outcome::ALL), true),
            ("LIMIT", words(&Limit::ALL), true),
            ("POLICY", words(&PolicySlot::ALL), true),
            (
                "OVERFLOW",
                OVERFLOW.iter().map(|(_, w, _)| *w).collect(),
                false,
            ),
            ("HEADER", words(&HeaderSlot::ALL), true),
            ("FLAG", words(&ItemFlag::ALL), true),
            ("FIELD", fields(true), true),
            ("BATCH", fields(false), true),
        ]
    }

    /// The two sides agree: every constant the Lua names is one Rust
    /// defines (a misspelt one would be nil in Lua, not an error), every
    /// outcome, limit, field and packed place Rust defines is used by the
    /// Lua, and the library and the redrive script start with the tables.
    #[test]
    fn the_lua_names_what_rust_defines() {
        for (table, defined, all_used) in tables() {
            let used = used(table);
            for name in &used {
                assert!(
                    defined.contains(&name.as_str()),
                    "the Lua uses {table}.{name}, which Rust does not define"
                );
                assert!(
                    PRELUDE.contains(&format!(" {name} = ")),
                    "{table}.{name} is not generated"
                );
            }
            if all_used {
                for name in defined {
                    assert!(
                        used.iter().any(|u| u == name),
                        "the Lua never uses {table}.{name}"
                    );
                }
            }
            assert!(PRELUDE.contains(&format!("local {table} = {{")), "{table}");
        }
        assert!(LIBRARY.code.contains(PRELUDE.as_str()));
    }

    /// No Lua spells what the tables name: no field byte (a decimal escape
    /// from 128), no table of its own for them, no bare outcome code, no
    /// header or policy unpacked by position, and the SIZE/BYTES rule is
    /// written once.
    #[test]
    fn the_lua_spells_no_code() {
        for source in sources() {
            let first = source.lines().next().unwrap_or_default();
            for (at, _) in source.match_indices('\\') {
                let digits: String = source[at + 1..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let byte: u32 = digits.parse().unwrap_or(0);
                assert!(byte < 128, "a field byte \\{byte} in {first}");
            }
            for table in [
                "REASON", "OUTCOME", "LIMIT", "POLICY", "OVERFLOW", "HEADER", "FLAG", "FIELD",
                "BATCH", "SEP",
            ] {
                assert!(
                    !source.contains(&format!("local {table} =")),
                    "{table} defined in {first}"
                );
            }
            for line in source.lines() {
                let line = line.trim();
                if let Some(rest) = line.strip_prefix("out[2 * i]") {
                    let value = rest.rsplit('=').next().unwrap_or_default().trim();
                    assert!(
                        !value.starts_with(|c: char| c.is_ascii_digit()),
                        "a bare outcome in {first}: {line}"
                    );
                }
            }
            for positional in ["'<ddddd'", "'<dddddddddddddd'"] {
                assert!(!source.contains(positional), "{positional} in {first}");
            }
            assert!(
                !source.contains(">= p.max_bytes"),
                "a BYTES rule in {first}"
            );
        }
        let bytes_rules: usize = sources()
            .iter()
            .map(|s| s.matches("REASON.BYTES").count())
            .sum();
        assert_eq!(bytes_rules, 1, "the SIZE/BYTES rule is written once");
    }
}
