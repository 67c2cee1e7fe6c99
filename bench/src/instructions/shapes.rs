//! The workload of `batcher-bench instructions`: its shapes, the seeded
//! items every shape draws from, and the two policies they run under.

use std::time::Duration;

use batcher::config::Config;
use batcher::policy::{Policy, PolicyHandle};

use crate::load::{self, Rng};
use crate::policies::{DEADLINE_AHEAD_S, DEADLINE_ONE_IN, RULES_CONFIG, VOLUME_CM3, WEIGHT_G};

/// Items of `addmany`, `sharded`, `every_rule`, `floor_addmany`,
/// `floor_dedup`, `floor_batch`, `floor_fields`, `floor_counters` and
/// `floor_rules`.
pub(super) const ITEMS: usize = 10_000;
/// Items of `unary`, `rounds`, `floor_unary`, `floor_batch_unary` and
/// `floor_rounds` (and the calls of those of one item a call).
pub(super) const UNARY_ITEMS: usize = 1_500;
/// Items per call of the many-item shapes.
pub(super) const PER_CALL: usize = 100;
/// Distinct group keys the items are drawn over.
pub(super) const KEYS: u64 = 1_000;
/// Seed of the key draws (the parcels' draws use the next one).
pub(super) const SEED: u64 = 0x1157_2024;
/// Redis servers each floor shape runs on (see [`Shape::starts`]).
const FLOOR_STARTS: usize = 3;

/// Which add path a shape runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// `Store::add`, with every rule on or with the plain policy.
    Store { rules: bool },
    /// A frozen floor script by EVALSHA (see [`Floor`]).
    Floor(Floor),
    /// BullMQ's `addBulk` (bulk) or `add`, by `bench/peer/bullmq.mjs
    /// --count` (only with `--peer`).
    Peer { bulk: bool },
}

/// Which frozen floor script a floor shape runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Floor {
    /// `bench/floor/floor.lua`: max_items and max_wait, no dedup window.
    Plain,
    /// `bench/floor/floor_dedup.lua`: the plain floor and a dedup window.
    Dedup,
    /// `bench/floor/floor_rules.lua`: the dedup floor and every rule of
    /// `every_rule`'s policy, with its parcels.
    Rules,
    /// `bench/floor/floor_batch.lua`: the dedup floor and what batcher
    /// keeps of a plain group and its batch (arrival order and times, the
    /// opening time, the batch's format).
    Batch,
    /// `bench/floor/floor_fields.lua`: `Batch` with the batch as format 4
    /// writes it (the group's hash passed to XADD as it is).
    Fields,
    /// `bench/floor/floor_counters.lua`: `Fields` with the group's counters
    /// as batcher's layout keeps them (HMGET and HSET of a packed field).
    Counters,
}

/// One shape of the workload.
pub(super) struct Shape {
    pub(super) name: &'static str,
    pub(super) route: Route,
    pub(super) items: usize,
    pub(super) per_call: usize,
    /// Shards of its keyspace: 1, so that a call of the store is one add
    /// call, but for `rounds`, `sharded` and `floor_rounds`.
    pub(super) shards: u16,
}

impl Shape {
    /// Whether --check holds it to its baseline (the floor's and the
    /// peer's are not ours).
    pub(super) fn checked(&self) -> bool {
        matches!(self.route, Route::Store { .. })
    }

    /// On how many fresh Redis servers it runs: the figure is their median.
    /// Redis seeds its dict hashes (so the chains its command table
    /// lookups walk) and its skiplist levels anew at each start, which moves
    /// a shape by a roughly fixed number of instructions per command: about
    /// 0.1% of ours, but up to 0.8% of the floor's, which does much less per
    /// command.
    pub(super) fn starts(&self) -> usize {
        if matches!(self.route, Route::Floor(_)) {
            FLOOR_STARTS
        } else {
            1
        }
    }
}

/// Items of each store call of `rounds`, over [`ROUND_SHARDS`] shards.
pub(super) const ROUND_ITEMS: usize = 16;
/// Shards of `rounds` and `sharded`: the service's default.
pub(super) const ROUND_SHARDS: u16 = 16;

pub(super) const SHAPES: [Shape; 14] = [
    Shape {
        name: "addmany",
        route: Route::Store { rules: false },
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "unary",
        route: Route::Store { rules: false },
        items: UNARY_ITEMS,
        per_call: 1,
        shards: 1,
    },
    Shape {
        name: "rounds",
        route: Route::Store { rules: false },
        items: UNARY_ITEMS,
        per_call: ROUND_ITEMS,
        shards: ROUND_SHARDS,
    },
    Shape {
        name: "sharded",
        route: Route::Store { rules: false },
        items: ITEMS,
        per_call: PER_CALL,
        shards: ROUND_SHARDS,
    },
    Shape {
        name: "every_rule",
        route: Route::Store { rules: true },
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_addmany",
        route: Route::Floor(Floor::Plain),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_unary",
        route: Route::Floor(Floor::Plain),
        items: UNARY_ITEMS,
        per_call: 1,
        shards: 1,
    },
    Shape {
        name: "floor_dedup",
        route: Route::Floor(Floor::Dedup),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_batch",
        route: Route::Floor(Floor::Batch),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_fields",
        route: Route::Floor(Floor::Fields),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_counters",
        route: Route::Floor(Floor::Counters),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "floor_batch_unary",
        route: Route::Floor(Floor::Batch),
        items: UNARY_ITEMS,
        per_call: 1,
        shards: 1,
    },
    Shape {
        name: "floor_rounds",
        route: Route::Floor(Floor::Batch),
        items: UNARY_ITEMS,
        per_call: ROUND_ITEMS,
        shards: ROUND_SHARDS,
    },
    Shape {
        name: "floor_rules",
        route: Route::Floor(Floor::Rules),
        items: ITEMS,
        per_call: PER_CALL,
        shards: 1,
    },
];

/// Jobs of `bullmq_addbulk` and `bullmq_add`: BullMQ does more per job than
/// we do per item, so fewer of them keep the run short (twice as many moved
/// the per-job figures by 0.3% and less).
const PEER_JOBS: usize = 2_000;
const PEER_UNARY_JOBS: usize = 500;

/// The peer shapes of `--peer`: BullMQ (bench/peer) adding jobs shaped like
/// our items (a 15-byte name over 1,000 keys, data of a 25-byte id and a
/// 32-byte payload), one call at a time.
pub(super) const PEER_SHAPES: [Shape; 2] = [
    Shape {
        name: "bullmq_addbulk",
        route: Route::Peer { bulk: true },
        items: PEER_JOBS,
        per_call: PER_CALL,
        shards: 1,
    },
    Shape {
        name: "bullmq_add",
        route: Route::Peer { bulk: false },
        items: PEER_UNARY_JOBS,
        per_call: 1,
        shards: 1,
    },
];

/// One item of the sequence, before it is shaped for a path.
pub(super) struct Draw {
    /// Which of the [`KEYS`] keys.
    pub(super) key: u64,
    pub(super) id: String,
    pub(super) weight_g: u64,
    pub(super) volume_cm3: u64,
    /// Seconds ahead, for the one in [`DEADLINE_ONE_IN`] that has a deadline.
    pub(super) deadline_s: Option<u64>,
}

/// The first `n` items of the seeded sequence: the same keys and ids for
/// every shape, and parcels drawn from a stream of their own, so turning the
/// rules on changes nothing else.
pub(super) fn sequence(n: usize) -> Vec<Draw> {
    let mut keys = Rng::new(SEED);
    let mut parcels = Rng::new(SEED + 1);
    let mut draw =
        |range: &std::ops::Range<u64>| range.start + parcels.below(range.end - range.start);
    (0..n)
        .map(|seq| Draw {
            key: keys.below(KEYS),
            id: load::id("ins0", 0, seq as u64),
            weight_g: draw(&WEIGHT_G),
            volume_cm3: draw(&VOLUME_CM3),
            deadline_s: (draw(&(0..DEADLINE_ONE_IN)) == 0).then(|| draw(&DEADLINE_AHEAD_S)),
        })
        .collect()
}

/// The group key of draw `n`: `ib-…` under the plain policy, `pr-…` (the
/// every-rule glob) under the rules; 15 bytes either way.
pub(super) fn group_key(rules: bool, n: u64) -> String {
    load::key(if rules { "pr" } else { "ib" }, "ins0", n)
}

/// The two policies, from the service's own config code: the bench's
/// defaults (max_items 10, max_wait 1 h) and scenario 11's every-rule glob.
pub(super) struct Policies {
    pub(super) handle: PolicyHandle,
    pub(super) plain: Policy,
    pub(super) rules: Policy,
    pub(super) dedup: Duration,
}

pub(super) fn policies() -> Result<Policies, String> {
    let text = format!("[defaults]\nmax_items = 10\nmax_wait = \"1h\"\n{RULES_CONFIG}");
    let config = Config::parse(&text, "instructions").map_err(|e| e.to_string())?;
    let table = config.policies();
    let plain = table.resolve(&group_key(false, 0));
    let rules = table.resolve(&group_key(true, 0));
    if plain == rules || rules.capacity.is_empty() {
        return Err("the every-rule glob did not resolve".into());
    }
    Ok(Policies {
        handle: PolicyHandle::new(table),
        plain,
        rules,
        dedup: config.dedup.window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_fixed() {
        let a = sequence(50);
        let b = sequence(50);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.key == y.key && x.id == y.id)
        );
        assert_eq!(a[0].id.len(), 25);
        assert_eq!(group_key(true, a[0].key).len(), 15);
        assert!(a.iter().any(|d| d.deadline_s.is_some()));
    }

    #[test]
    fn both_policies_resolve() {
        let p = policies().expect("policies");
        assert_eq!(p.plain.max_items, 10);
        assert_eq!(p.rules.min_items, 3);
        assert!(p.rules.cutoffs.is_some());
    }
}
