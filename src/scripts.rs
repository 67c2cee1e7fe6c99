//! The Lua scripts, one per atomic operation. Each is loaded once and run by
//! EVALSHA (redis-rs falls back to loading it on NOSCRIPT).

use std::sync::LazyLock;

use redis::Script;

use crate::batch::FlushReason;

/// Functions shared by the scripts that read or write groups and batches.
const BATCH_LIB: &str = include_str!("lua/batch_lib.lua");

/// A script that writes or reads batches: the `REASON` table made from the
/// Rust table of flush reasons, so that both languages name them from one
/// list, then the shared functions, then the script itself.
fn with_batch_lib(script: &str) -> Script {
    Script::new(&[&FlushReason::lua_table(), BATCH_LIB, script].concat())
}

/// Adds items to the open groups of one shard; flushes groups that fill up,
/// that an item does not fit, or whose cutoff has passed.
pub static ADD_ITEMS: LazyLock<Script> =
    LazyLock::new(|| with_batch_lib(include_str!("lua/add_items.lua")));

/// Flushes one group, by due time (only if due, and holding a group below
/// `min_items`) or by request.
pub static FLUSH_GROUP: LazyLock<Script> =
    LazyLock::new(|| with_batch_lib(include_str!("lua/flush_group.lua")));

/// Reads which groups of a shard are due.
pub static DUE_GROUPS: LazyLock<Script> =
    LazyLock::new(|| with_batch_lib(include_str!("lua/due_groups.lua")));

/// Removes one item from its open group.
pub static REMOVE_ITEM: LazyLock<Script> =
    LazyLock::new(|| with_batch_lib(include_str!("lua/remove_item.lua")));

/// Redelivers a consumer group's timed-out batches, or dead-letters them.
pub static CLAIM_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/claim_batches.lua")));

/// Acknowledges batches for a consumer group.
pub static ACK_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ack_batches.lua")));

/// Re-drives dead-lettered batches to their consumer group.
pub static REDRIVE_BATCHES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/redrive_batches.lua")));
