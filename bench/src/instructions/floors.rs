//! The route of the floor shapes (see [`Route`](super::shapes::Route)): a
//! frozen floor script of `bench/floor/`, by EVALSHA over one shard, or over
//! several as the sections of a function, on a profiled Redis, one call at
//! a time, counting only the calls after a warm-up.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;
use std::time::Duration;

use batcher::keys::Keyspace;
use batcher::policy::Policy;
use batcher::store::LANES;

use super::Measured;
use super::profiled::{Profiled, connection};
use super::routes::{flushall, keyspace, now_ms};
use super::shapes::{Draw, Floor, Policies, Shape, group_key, sequence};
use crate::load::PAYLOAD;

/// The frozen floor scripts' texts (see the header of each), and each as a
/// redis-rs script.
const FLOOR_SOURCE: &str = include_str!("../../floor/floor.lua");
const FLOOR_DEDUP_SOURCE: &str = include_str!("../../floor/floor_dedup.lua");
const FLOOR_RULES_SOURCE: &str = include_str!("../../floor/floor_rules.lua");
const FLOOR_BATCH_SOURCE: &str = include_str!("../../floor/floor_batch.lua");
const FLOOR_FIELDS_SOURCE: &str = include_str!("../../floor/floor_fields.lua");
const FLOOR_COUNTERS_SOURCE: &str = include_str!("../../floor/floor_counters.lua");
static FLOOR: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FLOOR_SOURCE));
static FLOOR_DEDUP: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FLOOR_DEDUP_SOURCE));
static FLOOR_RULES: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FLOOR_RULES_SOURCE));
static FLOOR_BATCH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FLOOR_BATCH_SOURCE));
static FLOOR_FIELDS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FLOOR_FIELDS_SOURCE));
static FLOOR_COUNTERS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FLOOR_COUNTERS_SOURCE));
/// The dedup window `floor_dedup` runs with: the service's default.
const FLOOR_WINDOW: Duration = Duration::from_secs(600);

/// The arguments of `floor_rules` before its items: every rule of the
/// every-rule policy, in ms (the next cutoff after `now`).
fn rules_args(policy: &Policy, now: u64) -> [u64; 6] {
    let ms = |d: Option<Duration>| d.map_or(0, |d| d.as_millis() as u64);
    let cap = |name: &str| policy.capacity.get(name).copied().unwrap_or(u64::MAX);
    [
        ms(policy.max_idle),
        cap("weight_g"),
        cap("volume_cm3"),
        policy.cutoffs.as_ref().map_or(0, |c| c.next_after(now)),
        policy.deadline_lead.as_millis() as u64,
        ms(policy.max_age),
    ]
}

/// A floor shape of several shards (`floor_rounds`) runs its script as a
/// function of this library, `floor_sections`: each store call's items go
/// as the round writers send ours ([`LANES`] calls, one per lane of shards
/// with items, each a section per shard), and the function runs the script
/// once per section, with that shard's KEYS and ARGV in tables of their own.
/// ARGV[1] is the count of sections n, then per section the counts of its
/// KEYS and of its ARGV; then each section's KEYS and ARGV in turn. The
/// script's text is unchanged (so each section reads Redis's TIME, which
/// ours reads once a call); `bench/peer/floor.mjs --spread` wraps it the
/// same way.
fn sections_library(source: &str) -> String {
    format!(
        "#!lua name=floor_sections\n\
         local function section(KEYS, ARGV)\n\
         local redis, tonumber, string, struct, math, unpack = \
         redis, tonumber, string, struct, math, unpack\n\
         {source}\n\
         end\n\
         redis.register_function('floor_sections', function(keys, args)\n\
         local n = tonumber(args[1])\n\
         local replies, k, a = {{}}, 0, 1 + 2 * n\n\
         for s = 1, n do\n\
         local nk, na = tonumber(args[2 * s]), tonumber(args[2 * s + 1])\n\
         local K, A = {{}}, {{}}\n\
         for i = 1, nk do K[i] = keys[k + i] end\n\
         for i = 1, na do A[i] = args[a + i] end\n\
         replies[s] = section(K, A)\n\
         k, a = k + nk, a + na\n\
         end\n\
         return replies\n\
         end)\n"
    )
}

/// One shard's part of a floor call: its KEYS and ARGV.
struct Section {
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

/// How a floor shape calls its script: its policy's arguments and the
/// KEYS and ARGV of a shard's items.
struct FloorCall<'a> {
    floor: Floor,
    policy: &'a Policy,
    keyspace: Keyspace,
}

impl FloorCall<'_> {
    /// The section of `draws`, all of `shard`, their keys named by `keys`.
    fn section(&self, shard: u16, draws: &[&Draw], keys: &dyn Fn(u64) -> String) -> Section {
        let now = now_ms();
        let rules = self.floor == Floor::Rules;
        let dedup = self.floor != Floor::Plain;
        let shard_keys = self.keyspace.shard(shard);
        let mut out = Section {
            keys: vec![shard_keys.due.clone(), shard_keys.stream.clone()],
            args: Vec::new(),
        };
        if dedup {
            out.keys.push(shard_keys.flushed.clone());
        }
        let mut groups: HashMap<u64, usize> = HashMap::new();
        let mut items: Vec<(usize, &Draw)> = Vec::with_capacity(draws.len());
        for draw in draws {
            let next = groups.len() + 1;
            let index = *groups.entry(draw.key).or_insert_with(|| {
                out.keys.push(self.keyspace.group(shard, &keys(draw.key)));
                next
            });
            items.push((index, draw));
        }
        fn push(args: &mut Vec<Vec<u8>>, a: impl redis::ToRedisArgs) {
            args.extend(a.to_redis_args());
        }
        let args = &mut out.args;
        push(args, self.policy.max_items);
        push(args, self.policy.max_wait.as_millis() as u64);
        if dedup {
            push(args, FLOOR_WINDOW.as_millis() as u64);
        }
        if rules {
            push(args, &rules_args(self.policy, now)[..]);
        }
        for (index, draw) in items {
            push(args, index);
            push(args, &draw.id);
            push(args, &PAYLOAD[..]);
            if rules {
                let deadline = draw.deadline_s.map_or(0, |s| now + s * 1000);
                let parcel: Vec<u8> = [draw.weight_g, draw.volume_cm3, deadline]
                    .iter()
                    .flat_map(|v| (*v as f64).to_le_bytes())
                    .collect();
                push(args, parcel);
            }
        }
        out
    }

    /// The calls of one store call's `draws`: with one shard one EVALSHA of
    /// `script`; with more, one FCALL of `floor_sections` per lane of shards
    /// with items, a section per shard, in shard order.
    fn calls(
        &self,
        script: &redis::Script,
        draws: &[Draw],
        keys: &dyn Fn(u64) -> String,
    ) -> Vec<redis::Cmd> {
        let shards = self.keyspace.shards();
        if shards == 1 {
            let all: Vec<&Draw> = draws.iter().collect();
            let section = self.section(0, &all, keys);
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.get_hash())
                .arg(section.keys.len())
                .arg(section.keys)
                .arg(section.args);
            return vec![cmd];
        }
        let mut by_shard: BTreeMap<u16, Vec<&Draw>> = BTreeMap::new();
        for draw in draws {
            let shard = self.keyspace.shard_of(&keys(draw.key));
            by_shard.entry(shard).or_default().push(draw);
        }
        (0..LANES)
            .filter_map(|lane| {
                let sections: Vec<Section> = by_shard
                    .iter()
                    .filter(|(shard, _)| *shard % LANES == lane)
                    .map(|(shard, draws)| self.section(*shard, draws, keys))
                    .collect();
                if sections.is_empty() {
                    return None;
                }
                let mut counts = vec![sections.len()];
                for section in &sections {
                    counts.extend([section.keys.len(), section.args.len()]);
                }
                let mut cmd = redis::cmd("FCALL");
                cmd.arg("floor_sections")
                    .arg(sections.iter().map(|s| s.keys.len()).sum::<usize>());
                for section in &sections {
                    cmd.arg(&section.keys);
                }
                cmd.arg(counts);
                for section in sections {
                    cmd.arg(section.args);
                }
                Some(cmd)
            })
            .collect()
    }
}

/// Counts a floor call's reply: its items added (returned) and the batches
/// they completed (into `flushed`). A sectioned call replies per section.
fn floor_tally(reply: redis::Value, flushed: &mut u64) -> usize {
    match reply {
        redis::Value::Array(values) => values.into_iter().map(|v| floor_tally(v, flushed)).sum(),
        redis::Value::Int(0) => 0,
        redis::Value::Int(_) => 1,
        _ => {
            *flushed += 1;
            1
        }
    }
}

/// A shape through a frozen floor script, one call at a time: the plain
/// policy's items, or with [`Floor::Rules`] the every-rule policy's with
/// their parcels; over one shard by EVALSHA, or over several as sections
/// of [`sections_library`]'s function.
pub(super) async fn run_floor(
    redis: &mut Profiled,
    shape: &Shape,
    policies: &Policies,
    floor: Floor,
) -> Result<Measured, String> {
    let mut conn = connection(redis.url()).await?;
    let rules = floor == Floor::Rules;
    let (script, source): (&redis::Script, &str) = match floor {
        Floor::Plain => (&FLOOR, FLOOR_SOURCE),
        Floor::Dedup => (&FLOOR_DEDUP, FLOOR_DEDUP_SOURCE),
        Floor::Rules => (&FLOOR_RULES, FLOOR_RULES_SOURCE),
        Floor::Batch => (&FLOOR_BATCH, FLOOR_BATCH_SOURCE),
        Floor::Fields => (&FLOOR_FIELDS, FLOOR_FIELDS_SOURCE),
        Floor::Counters => (&FLOOR_COUNTERS, FLOOR_COUNTERS_SOURCE),
    };
    let floor_call = FloorCall {
        floor,
        policy: if rules {
            &policies.rules
        } else {
            &policies.plain
        },
        keyspace: keyspace(shape.shards),
    };
    // Warm-up: loads the script (or its library), then leaves Redis empty.
    if shape.shards == 1 {
        script
            .load_async(&mut conn)
            .await
            .map_err(|e| format!("SCRIPT LOAD of the floor: {e}"))?;
    } else {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(sections_library(source))
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| format!("FUNCTION LOAD of the floor's sections: {e}"))?;
    }
    let mut warmed = 0;
    for cmd in floor_call.calls(script, &sequence(1), &|_| "warm-up".into()) {
        let reply: redis::Value = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("warm-up floor call: {e}"))?;
        warmed += floor_tally(reply, &mut 0);
    }
    if warmed != 1 {
        return Err("the floor's warm-up call added nothing".into());
    }
    flushall(&mut conn).await?;
    redis.dump().await?;

    let draws = sequence(shape.items);
    let keys = |n: u64| group_key(rules, n);
    let mut calls = 0;
    let mut added = 0;
    let mut flushed = 0;
    for chunk in draws.chunks(shape.per_call) {
        for cmd in floor_call.calls(script, chunk, &keys) {
            let reply: redis::Value = cmd
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("{}: floor call: {e}", shape.name))?;
            calls += 1;
            added += floor_tally(reply, &mut flushed);
        }
    }
    let instructions = redis.dump().await?;
    // floor_rules does not tell its capacity flushes from its size ones.
    let reason = if rules { "SIZE or CAPACITY" } else { "SIZE" };
    let batches = BTreeMap::from([(reason.to_string(), flushed)]);
    Measured::of_shape(shape, "the floor", added, calls, instructions, batches)
}
