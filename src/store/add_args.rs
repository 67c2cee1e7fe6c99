//! The add script's arguments, built in one place: the store's shard writers
//! and the bench's ceiling (which feeds them to `redis-benchmark`) both use
//! [`AddArgs`], so the two cannot drift apart.

use std::collections::HashMap;
use std::time::Duration;

use crate::keys::Keyspace;
use crate::policy::Policy;

/// The KEYS and ARGV of one call of the add script (`scripts::ADD_ITEMS`)
/// for one shard, as `src/lua/add_items.lua` documents them:
///
/// - KEYS: the shard's due set, stream and flushed set, then one hash per group;
/// - ARGV: the dedup window (ms), the group count G, per group its key,
///   `max_items`, `max_wait` (ms) and `max_bytes` (0 = none), then per item
///   its group number (from 1), id and payload.
///
/// Items of one key share a group, whose policy is the one given with its
/// first item. Keys are taken to be of `shard`: the store picks the shard
/// with [`Keyspace::shard_of`].
pub struct AddArgs<'a> {
    keyspace: &'a Keyspace,
    shard: u16,
    dedup: Duration,
    /// Group number (from 1) of each key seen so far.
    group_of: HashMap<&'a str, usize>,
    group_keys: Vec<String>,
    group_args: Vec<Vec<u8>>,
    item_args: Vec<Vec<u8>>,
}

impl<'a> AddArgs<'a> {
    /// No items yet, for a call in `shard` with the given dedup window.
    pub fn new(keyspace: &'a Keyspace, shard: u16, dedup: Duration) -> AddArgs<'a> {
        AddArgs {
            keyspace,
            shard,
            dedup,
            group_of: HashMap::new(),
            group_keys: Vec::new(),
            group_args: Vec::new(),
            item_args: Vec::new(),
        }
    }

    /// Appends one item to `key`'s group, adding the group (with `policy`)
    /// if it is the key's first item.
    pub fn item(&mut self, key: &'a str, policy: &Policy, id: &[u8], payload: &[u8]) -> &mut Self {
        let next = self.group_of.len() + 1;
        let group = *self.group_of.entry(key).or_insert_with(|| {
            self.group_keys.push(self.keyspace.group(self.shard, key));
            self.group_args.extend([
                key.as_bytes().to_vec(),
                policy.max_items.to_string().into_bytes(),
                millis(policy.max_wait).into_bytes(),
                policy.max_bytes.unwrap_or(0).to_string().into_bytes(),
            ]);
            next
        });
        self.item_args.extend([
            group.to_string().into_bytes(),
            id.to_vec(),
            payload.to_vec(),
        ]);
        self
    }

    /// The call's KEYS and ARGV.
    pub fn into_parts(self) -> (Vec<String>, Vec<Vec<u8>>) {
        let shard = self.keyspace.shard(self.shard);
        let mut keys = Vec::with_capacity(3 + self.group_keys.len());
        keys.extend([shard.due, shard.stream, shard.flushed]);
        keys.extend(self.group_keys);
        let mut args = Vec::with_capacity(2 + self.group_args.len() + self.item_args.len());
        args.push(millis(self.dedup).into_bytes());
        args.push(self.group_of.len().to_string().into_bytes());
        args.extend(self.group_args);
        args.extend(self.item_args);
        (keys, args)
    }
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
            ["due", "batches", "flushed", "g:a", "g:b"].map(|k| format!("{}:{k}", keyspace.tag(2)))
        );
        let argv: Vec<&str> = argv
            .iter()
            .map(|a| std::str::from_utf8(a).unwrap())
            .collect();
        assert_eq!(
            argv,
            [
                "60000", "2", "a", "10", "250", "0", "b", "5", "250", "64", "1", "1", "x", "2",
                "2", "", "1", "3", "z"
            ]
        );
    }
}
