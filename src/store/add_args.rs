//! The add function's arguments, built in one place, [`AddArgs`]: the
//! service validates, resolves and packs before the call (each policy once
//! per call, as doubles), so the library only reads and writes. They are
//! written straight into the call's command ([`AddCall`]), borrowing each
//! item's id and payload, so an item's bytes are copied once on their way
//! to Redis.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::RedisWrite;

use super::ext;
use crate::batch::Item;
use crate::keys::Keyspace;
use crate::policy::{Overflow, Policy};

/// The KEYS and ARGV of one call of the library's add function
/// (`src/lua/add_call.lua` documents them) for one shard:
///
/// - KEYS: the shard's due set, stream, flushed set and open-group index,
///   one hash per group, then the shard's requeued set when an item is
///   requeued;
/// - ARGV: a header, one argument: the dedup window in ms, the counts of
///   the call's distinct policies and of its groups, the shape of an
///   item's arguments and the lead (below; 0 for none), as five
///   little-endian doubles, then the length of each policy packed
///   ([`packed_policy`]), one double each, and the policies so packed
///   (one argument, not one per policy: Redis grows its ARGV table for
///   every argument, about 700 instructions each, and the function
///   parses a header it has seen once only); per group its key, and its
///   policy's number (from 1) when the call has more than one; then per item its group's
///   number (from 1) with its flags, its id, payload and packed ext. An
///   item has no ext argument when no item of the call has one, and no
///   group number when no item has flags and the call has one group or
///   one item per group (the shape is then negative).
/// - The lead: when items carry group numbers and the call has no limit on
///   open groups, the groups given a single item without flags come
///   first, in their order, and so do their items (the rest keep theirs),
///   and the header's fifth double counts them: the function takes
///   them as it takes a call of one item per group, without the arrival
///   chains a group of several items needs. Only the order in which the
///   call's groups are taken changes, which nothing but the limits on open
///   groups can tell; [`AddCall::order`] says where each item went.
///
/// Items of one key share a group, whose policy is the one given with its
/// first item. Keys are taken to be of `shard`: the store picks the shard
/// with [`Keyspace::shard_of`].
pub struct AddArgs<'a> {
    keyspace: &'a Keyspace,
    shard: u16,
    dedup: Duration,
    /// The shard's part of `[limits] max_open_groups` (0: none).
    open_limit: u32,
    /// Group number (from 1) of each key seen so far, once the call has
    /// more than [`SCAN_GROUPS`] groups (until then, they are scanned).
    group_of: HashMap<&'a str, usize>,
    /// Each group's key and its policy's number (from 1).
    groups: Vec<(&'a str, usize)>,
    items: Vec<ItemArgs<'a>>,
    /// Whether a group of the call is under a limit on open groups.
    limited: bool,
    /// Whether an item has flags, and whether one has an ext.
    flags: bool,
    exts: bool,
    /// Whether an item is requeued (the call names the requeued set).
    requeued: bool,
    /// The call's distinct policies, each packed once per call: the cutoffs
    /// take a time-zone lookup.
    policies: Vec<(Policy, Vec<u8>)>,
}

/// How far the Redis clock may run ahead of this machine's before a group
/// could miss its first cutoff: the function gets the first cutoff after
/// now minus this, and the one after it, and takes the first still ahead.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Up to this many groups, a call finds a key's group by scanning them,
/// which costs less than hashing the key; past it, in a map.
const SCAN_GROUPS: usize = 8;

impl<'a> AddArgs<'a> {
    /// No items yet, for a call in `shard` with the given dedup window.
    pub fn new(keyspace: &'a Keyspace, shard: u16, dedup: Duration) -> AddArgs<'a> {
        AddArgs {
            keyspace,
            shard,
            dedup,
            open_limit: 0,
            group_of: HashMap::new(),
            groups: Vec::new(),
            items: Vec::new(),
            limited: false,
            flags: false,
            exts: false,
            requeued: false,
            policies: Vec::new(),
        }
    }

    /// The same call under a limit of `total` open groups over all shards
    /// (`[limits] max_open_groups`; 0: none), of which this shard enforces
    /// its part.
    pub fn with_open_limit(mut self, total: u32) -> Self {
        self.open_limit = crate::policy::per_shard(total, self.keyspace.shards());
        self
    }

    /// Room for `items` more items, of as many groups at most.
    pub fn reserve(&mut self, items: usize) {
        self.items.reserve(items);
        self.groups.reserve(items);
    }

    /// Appends one plain item to `key`'s group, adding the group (with
    /// `policy`) if it is the key's first item.
    pub fn item(
        &mut self,
        key: &'a str,
        policy: &Policy,
        id: &'a [u8],
        payload: &'a [u8],
    ) -> &mut Self {
        let group = self.group(key, policy);
        self.items.push(ItemArgs {
            group,
            close: false,
            requeue_of: None,
            id,
            payload,
            ext: Vec::new(),
        });
        self
    }

    /// Appends one item with what it carries (measures, deadline, requeue
    /// count) and its flags: `close` flushes the group after it, and
    /// `requeue_of` names the batch a requeued item comes from.
    pub fn item_with(
        &mut self,
        key: &'a str,
        policy: &Policy,
        item: &'a Item,
        close: bool,
        requeue_of: Option<&'a str>,
    ) -> &mut Self {
        let group = self.group(key, policy);
        // The group's policy's capacity, whose names order the item's values.
        let (_, policy) = self.groups[group - 1];
        let ext = ext::packed(item, &self.policies[policy - 1].0.capacity);
        self.flags |= close || requeue_of.is_some();
        self.requeued |= requeue_of.is_some();
        self.exts |= !ext.is_empty();
        self.items.push(ItemArgs {
            group,
            close,
            requeue_of,
            id: &item.id,
            payload: &item.payload,
            ext,
        });
        self
    }

    /// The group number of `key`, adding its group (with `policy`) if new.
    fn group(&mut self, key: &'a str, policy: &Policy) -> usize {
        let found = if self.groups.len() <= SCAN_GROUPS {
            self.groups
                .iter()
                .position(|(k, _)| *k == key)
                .map(|at| at + 1)
        } else {
            if self.group_of.is_empty() {
                let numbered = self
                    .groups
                    .iter()
                    .enumerate()
                    .map(|(at, (k, _))| (*k, at + 1));
                self.group_of.extend(numbered);
            }
            self.group_of.get(key).copied()
        };
        if let Some(number) = found {
            return number;
        }
        let number = self.groups.len() + 1;
        if !self.group_of.is_empty() {
            self.group_of.insert(key, number);
        }
        let at = match self.policies.iter().position(|(p, _)| p == policy) {
            Some(at) => at,
            None => {
                let limits = OpenLimits {
                    policy: crate::policy::per_shard(policy.max_groups, self.keyspace.shards()),
                    shard: self.open_limit,
                };
                self.limited |= limits.policy > 0 || limits.shard > 0;
                let packed = packed_policy(policy, limits);
                self.policies.push((policy.clone(), packed));
                self.policies.len() - 1
            }
        };
        self.groups.push((key, at + 1));
        number
    }

    /// The call laid out, the lead (see the type) first, ready to write.
    pub fn finish(mut self) -> AddCall<'a> {
        // Each item's arguments: its id and payload, its ext when an item
        // of the call has one, and its group's number first unless no item
        // has flags and the call has one group or one item per group.
        let groups = self.groups.len();
        let numbered = self.flags || (groups > 1 && groups < self.items.len());
        let mut order = Vec::new();
        let lead = if numbered && !self.limited {
            self.lead_first(&mut order)
        } else {
            0
        };
        AddCall {
            args: self,
            numbered,
            lead,
            order,
        }
    }

    /// Puts the lead (see the type) first: the groups given one item
    /// without flags, renumbered from 1 in their order, then the others,
    /// and their items likewise, writing into `order` where each item came
    /// from (nothing when none moves). Returns how many groups lead.
    fn lead_first(&mut self, order: &mut Vec<usize>) -> usize {
        let groups = self.groups.len();
        let mut items_of = vec![0usize; groups];
        let mut flagged = vec![false; groups];
        for item in &self.items {
            items_of[item.group - 1] += 1;
            flagged[item.group - 1] |= item.flagged();
        }
        let leads = |g: usize| items_of[g] == 1 && !flagged[g];
        let lead = (0..groups).filter(|&g| leads(g)).count();
        if lead == 0 || lead == groups {
            return lead;
        }
        // The new number of each group: the lead's first, then the rest's.
        let mut renumber = vec![0; groups];
        let (mut next_lead, mut next_rest) = (1, lead + 1);
        for (g, number) in renumber.iter_mut().enumerate() {
            let next = if leads(g) {
                &mut next_lead
            } else {
                &mut next_rest
            };
            *number = *next;
            *next += 1;
        }
        self.groups = renumbered(std::mem::take(&mut self.groups), &renumber);
        for item in &mut self.items {
            item.group = renumber[item.group - 1];
        }
        // The lead's items first (their groups are in their order), then
        // the rest's in theirs.
        let mut items: Vec<(usize, ItemArgs)> = std::mem::take(&mut self.items)
            .into_iter()
            .enumerate()
            .collect();
        items.sort_by_key(|(_, item)| item.group > lead);
        for (at, item) in items {
            order.push(at);
            self.items.push(item);
        }
        lead
    }
}

/// One shard's add call, laid out: how many keys and arguments it has, and
/// the writing of them into a command (or any [`RedisWrite`]).
pub struct AddCall<'a> {
    args: AddArgs<'a>,
    /// Whether each item's arguments start with its group's number.
    numbered: bool,
    /// How many groups lead (see [`AddArgs`]).
    lead: usize,
    /// Where each item went, when the lead moved some: the reply to the
    /// call's `j`-th item is the reply to the `order[j]`-th item given.
    /// Empty when every item kept its place.
    order: Vec<usize>,
}

impl AddCall<'_> {
    /// The call's KEYS count.
    pub fn key_count(&self) -> usize {
        4 + self.args.groups.len() + usize::from(self.args.requeued)
    }

    /// The call's ARGV count.
    pub fn arg_count(&self) -> usize {
        let per_group = 1 + usize::from(self.args.policies.len() > 1);
        1 + per_group * self.args.groups.len() + self.per_item() * self.args.items.len()
    }

    /// About how many bytes the call's keys and arguments take.
    pub fn size_hint(&self) -> usize {
        let tag = self.args.keyspace.tag(self.args.shard).len();
        let groups: usize = self
            .args
            .groups
            .iter()
            .map(|(key, _)| tag + 6 + key.len())
            .sum();
        let items: usize = self.args.items.iter().map(ItemArgs::size_hint).sum();
        let policies: usize = self.args.policies.iter().map(|(_, p)| 8 + p.len()).sum();
        5 * (tag + 10) + groups + items + policies + 40
    }

    /// Where each item went (see the field).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Writes the call's KEYS into `out`.
    pub fn write_keys(&self, out: &mut impl RedisWrite) {
        let args = &self.args;
        let shard = args.keyspace.shard_keys(args.shard);
        for key in [&shard.due, &shard.stream, &shard.flushed, &shard.open_index] {
            out.write_arg(key.as_bytes());
        }
        let tag = args.keyspace.tag(args.shard);
        for (key, _) in &args.groups {
            let mut name = out.writer_for_next_arg();
            write_all(&mut name, &[tag.as_bytes(), b":g:", key.as_bytes()]);
        }
        if args.requeued {
            out.write_arg(shard.requeued.as_bytes());
        }
    }

    /// Writes the call's ARGV into `out`.
    pub fn write_args(&self, out: &mut impl RedisWrite) {
        let args = &self.args;
        let per_item = self.per_item();
        let shape = if self.numbered {
            per_item as f64
        } else {
            -(per_item as f64)
        };
        let policies = args.policies.len();
        let numbers = [
            args.dedup.as_millis() as f64,
            policies as f64,
            args.groups.len() as f64,
            shape,
            self.lead as f64,
        ];
        {
            let mut header = out.writer_for_next_arg();
            let lengths = args.policies.iter().map(|(_, packed)| packed.len() as f64);
            for number in numbers.into_iter().chain(lengths) {
                write_all(&mut header, &[&number.to_le_bytes()]);
            }
            for (_, packed) in &args.policies {
                write_all(&mut header, &[packed]);
            }
        }
        for (key, policy) in &args.groups {
            out.write_arg(key.as_bytes());
            if policies > 1 {
                out.write_arg_fmt(policy);
            }
        }
        for item in &args.items {
            if self.numbered {
                let mut group = out.writer_for_next_arg();
                let _ = write!(group, "{}", item.group);
                if item.close {
                    write_all(&mut group, &[b"c"]);
                }
                if let Some(batch) = item.requeue_of {
                    write_all(&mut group, &[b"q", batch.as_bytes()]);
                }
            }
            out.write_arg(item.id);
            out.write_arg(item.payload);
            if args.exts {
                out.write_arg(&item.ext);
            }
        }
    }

    /// How many arguments each item takes.
    fn per_item(&self) -> usize {
        2 + usize::from(self.numbered) + usize::from(self.args.exts)
    }
}

/// Writes `parts` into one argument. The writers of redis-rs's commands
/// write into memory, so they cannot fail.
fn write_all(out: &mut impl Write, parts: &[&[u8]]) {
    for part in parts {
        out.write_all(part).expect("writing into memory");
    }
}

/// `list`, one entry per group, in the groups' new order: group `g`'s
/// entry (at `g - 1`) goes to `renumber[g - 1] - 1`.
fn renumbered<T>(list: Vec<T>, renumber: &[usize]) -> Vec<T> {
    let mut placed: Vec<(usize, T)> = renumber.iter().copied().zip(list).collect();
    placed.sort_unstable_by_key(|(number, _)| *number);
    placed.into_iter().map(|(_, v)| v).collect()
}

/// One item's arguments, borrowed from the item.
struct ItemArgs<'a> {
    /// Its group's number, from 1.
    group: usize,
    /// Flush the group after it (flag `c`).
    close: bool,
    /// The batch it is requeued from (flag `q` and the batch's id).
    requeue_of: Option<&'a str>,
    id: &'a [u8],
    payload: &'a [u8],
    ext: Vec<u8>,
}

impl ItemArgs<'_> {
    /// Whether it has flags.
    fn flagged(&self) -> bool {
        self.close || self.requeue_of.is_some()
    }

    /// About how many bytes its arguments take.
    fn size_hint(&self) -> usize {
        let flags = self.requeue_of.map_or(0, str::len);
        8 + flags + self.id.len() + self.payload.len() + self.ext.len()
    }
}

/// The limits on open groups one shard enforces for a policy's keys (0:
/// none).
struct OpenLimits {
    /// Its part of the policy's `max_groups`.
    policy: u32,
    /// Its part of `[limits] max_open_groups`.
    shard: u32,
}

/// A policy as the add function takes it, worked out once per call:
/// fourteen little-endian doubles (`max_items`, `max_bytes` or 0,
/// `min_items`, `max_wait`, `max_idle`, the first cutoff after now (less
/// the clock skew) and the one after it, `deadline_lead`, `max_age`, in
/// ms, 0 for none; k, the capacity's measure count; the shard's limits on
/// open groups, the policy's and the service's; the overflow, 0 to refuse
/// and 1 to flush the oldest; the length of its scope), then the
/// capacity's k limits as doubles, then its scope, then its measure names
/// joined by `;`, in the order an item's packed values follow.
fn packed_policy(policy: &Policy, open: OpenLimits) -> Vec<u8> {
    let (c1, c2) = policy.cutoffs.as_ref().map_or((0, 0), |cutoffs| {
        // The local clock, for the cutoffs a group opened now would get.
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let skewed = now_ms.saturating_sub(CLOCK_SKEW.as_millis() as u64);
        let first = cutoffs.next_after(skewed);
        (first, cutoffs.next_after(first))
    });
    let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_millis() as f64);
    // Only a policy with its own limit (and so a scope) counts its groups apart.
    let (scope, policy_limit) = match &policy.scope {
        Some(scope) if open.policy > 0 => (scope.as_bytes(), open.policy),
        _ => (&[][..], 0),
    };
    let numbers = [
        f64::from(policy.max_items),
        policy.max_bytes.unwrap_or(0) as f64,
        f64::from(policy.min_items),
        ms(Some(policy.max_wait)),
        ms(policy.max_idle),
        c1 as f64,
        c2 as f64,
        ms(Some(policy.deadline_lead)),
        ms(policy.max_age),
        policy.capacity.len() as f64,
        f64::from(policy_limit),
        f64::from(open.shard),
        f64::from(u8::from(policy.overflow == Overflow::FlushOldest)),
        scope.len() as f64,
    ];
    let limits = policy.capacity.values().map(|v| *v as f64);
    let names: usize = policy.capacity.keys().map(|name| name.len() + 1).sum();
    let mut packed =
        Vec::with_capacity(8 * (numbers.len() + policy.capacity.len()) + scope.len() + names);
    for number in numbers.into_iter().chain(limits) {
        packed.extend_from_slice(&number.to_le_bytes());
    }
    packed.extend_from_slice(scope);
    // The measure names joined by `;`, in the capacity's order (the order
    // of a packed ext's values and of a group's sums).
    for (at, name) in policy.capacity.keys().enumerate() {
        if at > 0 {
            packed.push(b';');
        }
        packed.extend_from_slice(name.as_bytes());
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items of one key share a group; each distinct policy is packed once,
    /// and each group and item lands where the add function reads it, with
    /// no ext argument when no item has one: the groups given one item
    /// first (the lead, counted in the header), and the order says which
    /// item each reply is to.
    #[test]
    fn lays_out_policies_groups_then_items() {
        let keyspace = Keyspace::new("t", 4);
        let policy =
            |max_items, max_bytes| Policy::basic(max_items, Duration::from_millis(250), max_bytes);
        let mut args = AddArgs::new(&keyspace, 2, Duration::from_secs(60));
        args.item("a", &policy(10, None), b"1", b"x")
            .item("b", &policy(5, Some(64)), b"2", b"")
            .item("c", &policy(10, None), b"3", b"y")
            .item("a", &policy(99, None), b"4", b"z");
        let (keys, argv, order) = parts(args);
        assert_eq!(
            keys,
            ["due", "batches", "flushed", "open", "g:b", "g:c", "g:a"]
                .map(|k| format!("{}:{k}", keyspace.tag(2)))
        );
        assert_eq!(header(&argv[0]), [60000.0, 2.0, 3.0, 3.0, 2.0]);
        // Each 14 doubles: no capacity, no scope, no measure names.
        let policies = policies(&argv[0]);
        assert_eq!(
            policies.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [112, 112]
        );
        let first = policies[0].chunks_exact(8).next().unwrap();
        assert_eq!(f64::from_le_bytes(first.try_into().unwrap()), 10.0);
        assert_eq!(
            texts(&argv[1..]),
            [
                "b", "2", "c", "1", "a", "1", "1", "2", "", "2", "3", "y", "3", "1", "x", "3", "4",
                "z"
            ]
        );
        assert_eq!(order, [1, 2, 0, 3]);

        // Under a limit on open groups, the order of the groups is theirs.
        let mut args = AddArgs::new(&keyspace, 2, Duration::from_secs(60)).with_open_limit(8);
        args.item("a", &policy(10, None), b"1", b"x")
            .item("b", &policy(10, None), b"2", b"")
            .item("a", &policy(10, None), b"3", b"y");
        let (keys, argv, order) = parts(args);
        assert_eq!(
            &keys[4..],
            [
                format!("{}:g:a", keyspace.tag(2)),
                format!("{}:g:b", keyspace.tag(2))
            ]
        );
        assert_eq!(header(&argv[0]), [60000.0, 1.0, 2.0, 3.0, 0.0]);
        assert!(order.is_empty(), "no item moved");
    }

    /// A call of one group, or of one item per group, and no flags or exts
    /// sends each item as its id and payload alone; a requeued item brings
    /// its group number with its flags, its ext, and the requeued set as
    /// the last key.
    #[test]
    fn leaves_out_what_no_item_of_the_call_has() {
        let keyspace = Keyspace::new("t", 4);
        let policy = Policy::basic(10, Duration::from_secs(1), None);
        let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
        args.item("a", &policy, b"1", b"x")
            .item("a", &policy, b"2", b"y");
        let (keys, argv, _) = parts(args);
        assert_eq!(keys.len(), 5);
        assert_eq!(header(&argv[0]), [5000.0, 1.0, 1.0, -2.0, 0.0]);
        assert_eq!(texts(&argv[1..]), ["a", "1", "x", "2", "y"]);

        // One item per group: no group numbers either, and an ext when one
        // item has one.
        let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
        args.item("a", &policy, b"1", b"x")
            .item("b", &policy, b"2", b"y");
        let (_, argv, _) = parts(args);
        assert_eq!(header(&argv[0]), [5000.0, 1.0, 2.0, -2.0, 0.0]);
        assert_eq!(texts(&argv[1..]), ["a", "b", "1", "x", "2", "y"]);
        let dated = Item {
            id: b"2".to_vec(),
            payload: b"y".to_vec(),
            deadline_ms: Some(1),
            ..Item::default()
        };
        let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
        args.item("a", &policy, b"1", b"x")
            .item_with("b", &policy, &dated, false, None);
        let (_, argv, _) = parts(args);
        assert_eq!(header(&argv[0]), [5000.0, 1.0, 2.0, -3.0, 0.0]);
        assert_eq!(texts(&argv[1..6]), ["a", "b", "1", "x", ""]);
        assert_eq!((&argv[6][..], &argv[7][..]), (&b"2"[..], &b"y"[..]));
        assert!(!argv[8].is_empty(), "the dated item's ext");

        let item = Item {
            id: b"3".to_vec(),
            payload: b"z".to_vec(),
            requeue_count: 1,
            ..Item::default()
        };
        let mut args = AddArgs::new(&keyspace, 1, Duration::from_secs(5));
        args.item_with("a", &policy, &item, true, Some("7-0-b"));
        let (keys, argv, _) = parts(args);
        assert_eq!(
            keys.last().unwrap(),
            &format!("{}:requeued", keyspace.tag(1))
        );
        assert_eq!(header(&argv[0]), [5000.0, 1.0, 1.0, 4.0, 0.0]);
        assert_eq!(&texts(&argv[1..4]), &["a", "1cq7-0-b", "3"]);
        assert_eq!(argv[4], b"z");
        assert!(
            !argv[5].is_empty(),
            "a requeued item's ext holds its requeue count"
        );
    }

    /// The call's keys, arguments and order, as the command gets them.
    fn parts(args: AddArgs) -> (Vec<String>, Vec<Vec<u8>>, Vec<usize>) {
        let call = args.finish();
        let (mut keys, mut argv) = (Vec::<Vec<u8>>::new(), Vec::new());
        call.write_keys(&mut keys);
        call.write_args(&mut argv);
        assert_eq!(
            (keys.len(), argv.len()),
            (call.key_count(), call.arg_count())
        );
        let keys = keys
            .into_iter()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        (keys, argv, call.order().to_vec())
    }

    /// The header's five numbers.
    fn header(arg: &[u8]) -> Vec<f64> {
        arg.chunks_exact(8)
            .take(5)
            .map(|d| f64::from_le_bytes(d.try_into().unwrap()))
            .collect()
    }

    /// The policies the header packs, by the lengths after its numbers.
    fn policies(arg: &[u8]) -> Vec<&[u8]> {
        let count = header(arg)[1] as usize;
        let mut at = 8 * (5 + count);
        (0..count)
            .map(|j| {
                let len = f64::from_le_bytes(arg[8 * (5 + j)..][..8].try_into().unwrap());
                let packed = &arg[at..at + len as usize];
                at += len as usize;
                packed
            })
            .collect()
    }

    fn texts(args: &[Vec<u8>]) -> Vec<&str> {
        args.iter()
            .map(|a| std::str::from_utf8(a).unwrap())
            .collect()
    }

    /// A policy under limits on open groups packs each shard's part of
    /// them (rounded up), its overflow and its scope, before its measure
    /// names; one without its own limit packs no scope.
    #[test]
    fn packs_the_limits_on_open_groups() {
        let keyspace = Keyspace::new("t", 4);
        let mut policy = Policy::basic(10, Duration::from_secs(1), None);
        policy.max_groups = 10;
        policy.overflow = Overflow::FlushOldest;
        policy.scope = Some("kscan-*".into());
        let mut args = AddArgs::new(&keyspace, 0, Duration::from_secs(60)).with_open_limit(9);
        args.item("scan-1", &policy, b"1", b"x");
        let (_, argv, _) = parts(args);
        let packed = policies(&argv[0])[0];
        let double = |i: usize| f64::from_le_bytes(packed[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(
            (double(10), double(11), double(12), double(13)),
            (3.0, 3.0, 1.0, 7.0)
        );
        assert_eq!(&packed[112..], b"kscan-*");

        policy.scope = None;
        let mut args = AddArgs::new(&keyspace, 0, Duration::from_secs(60));
        args.item("scan-1", &policy, b"1", b"x");
        let (_, argv, _) = parts(args);
        let packed = policies(&argv[0])[0];
        let double = |i: usize| f64::from_le_bytes(packed[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!((double(10), double(11), double(13)), (0.0, 0.0, 0.0));
        assert_eq!(packed.len(), 112);
    }
}
