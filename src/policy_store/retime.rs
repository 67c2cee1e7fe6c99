//! Open groups follow a policy change. A shorter `max_wait` moves the due
//! time of each open group it applies to earlier, so that none waits past
//! its new window (the `retime` function, one atomic step per group); a
//! longer one applies to groups opened after the change. Limits
//! (`max_items`, `max_bytes`, capacity) need nothing here: every add and
//! every flush is judged by the policy in force, so the next add to a group
//! now over `max_items` cuts it, and its timeout flush cuts it too.
//!
//! Every instance does this for each change it takes in: the work is
//! idempotent, and a change stays followed when the instance that made it
//! stops right after.

use std::sync::Arc;

use super::KEYS;
use crate::policy::Policies;
use crate::store::{Store, StoredPolicy};

/// Whether a change can shorten some key's `max_wait`, given each changed
/// document before and after it (`None`: absent) and the tables before
/// (`old`) and after (`new`): the defaults' window is shorter, or a changed
/// pattern's, or a pattern came or went (which moves keys between
/// policies).
pub(super) fn may_shorten<'a>(
    changed: impl IntoIterator<Item = (&'a str, Option<&'a StoredPolicy>, Option<&'a StoredPolicy>)>,
    old: &Policies,
    new: &Policies,
) -> bool {
    if new.defaults().max_wait < old.defaults().max_wait {
        return true;
    }
    for (name, was, now) in changed {
        let Some(pattern) = name.strip_prefix(KEYS) else {
            continue;
        };
        match (was, now) {
            (Some(was), Some(now)) if was.revision == now.revision => continue,
            (Some(_), Some(_)) => {}
            (None, None) => continue,
            _ => return true,
        }
        // An exact key resolves to its own policy; a glob's keys may
        // resolve elsewhere, but its own window tells whether it shrank.
        if new.policy_of_pattern(pattern).map(|p| p.max_wait)
            < old.policy_of_pattern(pattern).map(|p| p.max_wait)
        {
            return true;
        }
    }
    false
}

/// Moves every open group whose `max_wait` is shorter under `new` than
/// under `old` to its new due time. Logs what fails; the next change, or
/// another instance, tries again.
pub(super) async fn follow(store: Store, old: Arc<Policies>, new: Arc<Policies>) {
    let mut moved = 0u64;
    for shard in 0..store.keyspace().shards() {
        let mut cursor = 0;
        loop {
            let (next, keys) = match store.open_keys(shard, cursor).await {
                Ok(page) => page,
                Err(err) => {
                    tracing::warn!(%err, shard, "cannot list open groups to follow a policy change");
                    break;
                }
            };
            for key in keys {
                let wait = new.resolve(&key).max_wait;
                if wait >= old.resolve(&key).max_wait {
                    continue;
                }
                match store.retime(&key, wait).await {
                    Ok(_) => moved += 1,
                    Err(err) => tracing::warn!(%err, key, "cannot move a group's due time"),
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    if moved > 0 {
        tracing::info!(groups = moved, "open groups moved under a shorter max_wait");
    }
}
