//! The add function's arguments, built in one place, [`AddArgs`]: the
//! service validates, resolves and packs before the call (each policy once
//! per call, as doubles), so the library only reads and writes. They are
//! written straight into the call's command ([`AddCall`]), borrowing each
//! item's id and payload, so an item's bytes are copied once on their way
//! to Redis.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod call;

pub use self::call::AddCall;

use crate::batch::Item;
use crate::keys::Keyspace;
use crate::policy::Policy;
use crate::scripts::codes::{PolicySlot, overflow_code};
use crate::store::ext;

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

/// A policy as the add function takes it, worked out once per call: the
/// little-endian doubles of [`PolicySlot`], each at its place, then the
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
    let mut numbers = [0.0; PolicySlot::ALL.len()];
    for (slot, _) in PolicySlot::ALL {
        numbers[slot as usize] = match slot {
            PolicySlot::MaxItems => f64::from(policy.max_items),
            PolicySlot::MaxBytes => policy.max_bytes.unwrap_or(0) as f64,
            PolicySlot::MinItems => f64::from(policy.min_items),
            PolicySlot::MaxWait => ms(Some(policy.max_wait)),
            PolicySlot::MaxIdle => ms(policy.max_idle),
            PolicySlot::Cutoff => c1 as f64,
            PolicySlot::NextCutoff => c2 as f64,
            PolicySlot::DeadlineLead => ms(Some(policy.deadline_lead)),
            PolicySlot::MaxAge => ms(policy.max_age),
            PolicySlot::Measures => policy.capacity.len() as f64,
            PolicySlot::MaxGroups => f64::from(policy_limit),
            PolicySlot::MaxOpenGroups => f64::from(open.shard),
            PolicySlot::Overflow => f64::from(overflow_code(policy.overflow)),
            PolicySlot::ScopeLength => scope.len() as f64,
        };
    }
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
mod tests;
