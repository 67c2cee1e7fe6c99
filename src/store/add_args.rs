//! The add script's arguments, built in one place: the store's shard writers
//! and the bench's ceiling (which feeds them to `redis-benchmark`) both use
//! [`AddArgs`], so the two cannot drift apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ext;
use crate::batch::Item;
use crate::keys::Keyspace;
use crate::policy::Policy;

/// The KEYS and ARGV of one call of the add script (`scripts::ADD_ITEMS`)
/// for one shard, as `src/lua/add_items.lua` documents them:
///
/// - KEYS: the shard's due set, stream, flushed set and requeued set, then
///   one hash per group;
/// - ARGV: the dedup window (ms), the group count G, per group its key,
///   `max_items`, `max_bytes` (0 = none), `min_items`, `max_wait` (ms), the
///   other due rules for a group that opens now and its capacity, then per
///   item its group number (from 1) with its flags, id, payload and ext.
///
/// Items of one key share a group, whose policy is the one given with its
/// first item. Keys are taken to be of `shard`: the store picks the shard
/// with [`Keyspace::shard_of`].
pub struct AddArgs<'a> {
    keyspace: &'a Keyspace,
    shard: u16,
    dedup: Duration,
    /// The local clock (ms), for the cutoffs a group opened now would get.
    now_ms: u64,
    /// Group number (from 1) of each key seen so far.
    group_of: HashMap<&'a str, usize>,
    group_keys: Vec<String>,
    /// Each group's capacity, whose names order an item's values.
    group_caps: Vec<Arc<BTreeMap<String, u64>>>,
    group_args: Vec<Vec<u8>>,
    item_args: Vec<Vec<u8>>,
    /// The arguments each policy of the call's groups gives its groups,
    /// worked out once per call: the cutoffs take a time-zone lookup.
    policy_args: Vec<(Policy, [Vec<u8>; 6])>,
}

/// How far the Redis clock may run ahead of this machine's before a group
/// could miss its first cutoff: the script gets the first cutoff after
/// now minus this, and the one after it, and takes the first still ahead.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

impl<'a> AddArgs<'a> {
    /// No items yet, for a call in `shard` with the given dedup window.
    pub fn new(keyspace: &'a Keyspace, shard: u16, dedup: Duration) -> AddArgs<'a> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        AddArgs {
            keyspace,
            shard,
            dedup,
            now_ms,
            group_of: HashMap::new(),
            group_keys: Vec::new(),
            group_caps: Vec::new(),
            group_args: Vec::new(),
            item_args: Vec::new(),
            policy_args: Vec::new(),
        }
    }

    /// Appends one plain item to `key`'s group, adding the group (with
    /// `policy`) if it is the key's first item.
    pub fn item(&mut self, key: &'a str, policy: &Policy, id: &[u8], payload: &[u8]) -> &mut Self {
        let group = self.group(key, policy);
        self.item_args.extend([
            group.to_string().into_bytes(),
            id.to_vec(),
            payload.to_vec(),
            Vec::new(),
        ]);
        self
    }

    /// Appends one item with what it carries (measures, deadline, requeue
    /// count) and its flags: `close` flushes the group after it, and
    /// `requeue_of` names the batch a requeued item comes from.
    pub fn item_with(
        &mut self,
        key: &'a str,
        policy: &Policy,
        item: &Item,
        close: bool,
        requeue_of: Option<&str>,
    ) -> &mut Self {
        let number = self.group(key, policy);
        let mut group = number.to_string();
        if close {
            group.push('c');
        }
        if let Some(batch) = requeue_of {
            group.push('q');
            group.push_str(batch);
        }
        let capacity = &self.group_caps[number - 1];
        self.item_args.extend([
            group.into_bytes(),
            item.id.clone(),
            item.payload.clone(),
            ext::packed(item, capacity),
        ]);
        self
    }

    /// The group number of `key`, adding its group (with `policy`) if new.
    fn group(&mut self, key: &'a str, policy: &Policy) -> usize {
        if let Some(&number) = self.group_of.get(key) {
            return number;
        }
        let number = self.group_of.len() + 1;
        self.group_of.insert(key, number);
        self.group_keys.push(self.keyspace.group(self.shard, key));
        self.group_caps.push(policy.capacity.clone());
        self.group_args.push(key.as_bytes().to_vec());
        let at = match self.policy_args.iter().position(|(p, _)| p == policy) {
            Some(at) => at,
            None => {
                let args = policy_args(policy, self.now_ms);
                self.policy_args.push((policy.clone(), args));
                self.policy_args.len() - 1
            }
        };
        self.group_args
            .extend(self.policy_args[at].1.iter().cloned());
        number
    }

    /// The call's KEYS and ARGV.
    pub fn into_parts(self) -> (Vec<String>, Vec<Vec<u8>>) {
        let shard = self.keyspace.shard(self.shard);
        let mut keys = Vec::with_capacity(4 + self.group_keys.len());
        keys.extend([shard.due, shard.stream, shard.flushed, shard.requeued]);
        keys.extend(self.group_keys);
        let mut args = Vec::with_capacity(2 + self.group_args.len() + self.item_args.len());
        args.push(millis(self.dedup).into_bytes());
        args.push(self.group_of.len().to_string().into_bytes());
        args.extend(self.group_args);
        args.extend(self.item_args);
        (keys, args)
    }
}

/// A group's arguments after its key, from its policy: `max_items`,
/// `max_bytes`, `min_items`, `max_wait`, the other due rules and the
/// capacity.
fn policy_args(policy: &Policy, now_ms: u64) -> [Vec<u8>; 6] {
    [
        policy.max_items.to_string().into_bytes(),
        policy.max_bytes.unwrap_or(0).to_string().into_bytes(),
        policy.min_items.to_string().into_bytes(),
        millis(policy.max_wait).into_bytes(),
        open_rules(policy, now_ms).into_bytes(),
        sums(policy.capacity.iter()).into_bytes(),
    ]
}

/// The due rules besides `max_wait` for a group opened now:
/// `max_idle,cutoff,next cutoff,deadline_lead,max_age` in ms, or `""` when
/// all are 0 (the script's fast path).
fn open_rules(policy: &Policy, now_ms: u64) -> String {
    let (c1, c2) = policy.cutoffs.as_ref().map_or((0, 0), |cutoffs| {
        let skewed = now_ms.saturating_sub(CLOCK_SKEW.as_millis() as u64);
        let first = cutoffs.next_after(skewed);
        (first, cutoffs.next_after(first))
    });
    let idle = policy.max_idle.map_or(0, |d| d.as_millis());
    let age = policy.max_age.map_or(0, |d| d.as_millis());
    let lead = policy.deadline_lead.as_millis();
    if idle == 0 && c1 == 0 && lead == 0 && age == 0 {
        return String::new();
    }
    format!("{idle},{c1},{c2},{lead},{age}")
}

/// Named amounts as the scripts write them: `name=v;name=v`.
pub(crate) fn sums<'m>(measures: impl Iterator<Item = (&'m String, &'m u64)>) -> String {
    let parts: Vec<String> = measures.map(|(name, v)| format!("{name}={v}")).collect();
    parts.join(";")
}

/// The group hash field that holds the sums of `capacity`'s measures: `=`
/// then their names joined by `;`, in the order the add script keeps them.
pub(crate) fn sums_field(capacity: &BTreeMap<String, u64>) -> String {
    let names: Vec<&str> = capacity.keys().map(String::as_str).collect();
    format!("={}", names.join(";"))
}

fn millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items of one key share a group; each group's policy and each item's
    /// group number land where the add script reads them.
    #[test]
    fn lays_out_groups_then_items() {
        let keyspace = Keyspace::new("t", 4);
        let policy =
            |max_items, max_bytes| Policy::basic(max_items, Duration::from_millis(250), max_bytes);
        let mut args = AddArgs::new(&keyspace, 2, Duration::from_secs(60));
        args.item("a", &policy(10, None), b"1", b"x")
            .item("b", &policy(5, Some(64)), b"2", b"")
            .item("a", &policy(99, None), b"3", b"z");
        let (keys, argv) = args.into_parts();
        assert_eq!(
            keys,
            ["due", "batches", "flushed", "requeued", "g:a", "g:b"]
                .map(|k| format!("{}:{k}", keyspace.tag(2)))
        );
        let argv: Vec<&str> = argv
            .iter()
            .map(|a| std::str::from_utf8(a).unwrap())
            .collect();
        assert_eq!(
            argv,
            [
                "60000", "2", "a", "10", "0", "0", "250", "", "", "b", "5", "64", "0", "250", "",
                "", "1", "1", "x", "", "2", "2", "", "", "1", "3", "z", ""
            ]
        );
    }
}
