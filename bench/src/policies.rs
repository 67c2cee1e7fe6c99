//! Scenario 11, every policy rule on: scenario 1's AddMany load, run eight
//! times in the same run, each time on a fresh service over an emptied
//! Redis, in the order plain, every rule, every rule, plain, twice: under the plain
//! policy (the bench's defaults: max_items 10, max_wait 1 h) and under
//! [`RULES_CONFIG`], which turns every rule on. Every item of an every-rule
//! run carries measures (weight and volume, drawn evenly from [`WEIGHT_G`]
//! and [`VOLUME_CM3`]) and one in [`DEADLINE_ONE_IN`] a deadline
//! [`DEADLINE_AHEAD_S`] seconds ahead. Figure: the Redis CPU per item of the
//! every-rule runs over that of the plain runs, each pooled over its four
//! runs, so that a machine that speeds up or slows down during the scenario
//! weighs on both policies alike, and one noisy run weighs on the figure
//! less (with two runs each, ratios of one build spread over ±0.05).

/// The order of the runs: true for every rule on.
pub const ORDER: [bool; 8] = [false, true, true, false, false, true, true, false];

use std::ops::Range;

use batcher::pb;

use super::ingest::{self, Ingest};
use super::load::{Rng, add_request, now_micros};
use super::scenarios::{Sizes, Target};

/// The key scenario of the every-rule run: its keys are `pr-<run><n>`, 15
/// bytes like scenario 1's.
const RULES_SCENARIO: &str = "pr";

/// The policy of the every-rule run, part of the bench's config. The
/// capacity is sized to the measures the items carry so that about half the
/// groups flush by CAPACITY (an item that does not fit closes the group
/// before it) and the rest by SIZE. No due time falls inside the run: the
/// idle and deadline rules move a group's due time minutes ahead on many
/// adds, and the next cutoff is hours ahead (unless the run happens to cross
/// one of the four a day; the details give the flushes by reason).
pub const RULES_CONFIG: &str = r#"
# Every policy rule on (scenario 11): size, wait, idle, capacity by two
# measures, four departures a day in Berlin, deadlines, and a minimum load.
[keys."pr-*"]
max_items = 10
max_wait = "1h"
max_idle = "30m"
capacity = { weight_g = 27000, volume_cm3 = 54000 }
cutoffs = ["05:30", "11:30", "17:45:30", "22:00"]
timezone = "Europe/Berlin"
deadline_lead = "5m"
min_items = 3
max_age = "2h"
"#;

/// The weights the items carry, in grams: mean 2.5 kg against a 27 kg capacity.
pub const WEIGHT_G: Range<u64> = 200..4800;
/// The volumes the items carry, in cm³: mean 5 l against a 54 l capacity.
pub const VOLUME_CM3: Range<u64> = 1000..9000;
/// One item in this many carries a deadline.
pub const DEADLINE_ONE_IN: u64 = 10;
/// How far ahead a deadline is, in seconds: 10 to 40 minutes.
pub const DEADLINE_AHEAD_S: Range<u64> = 600..2400;
/// The target: Redis CPU per item with every rule on ≤ this × the plain one.
pub const MAX_RATIO: f64 = 1.3;

/// The runs of scenario 11, by policy, in the order they ran in.
pub struct PolicyCost {
    pub plain: Vec<Ingest>,
    pub rules: Vec<Ingest>,
}

impl PolicyCost {
    /// Redis CPU per item of the every-rule runs over the plain runs'; None
    /// when Redis's CPU could not be read or the runs added nothing.
    pub fn ratio(&self) -> Option<f64> {
        let plain = pooled_us_per_item(&self.plain)?;
        let rules = pooled_us_per_item(&self.rules)?;
        (plain > 0.0).then(|| rules / plain)
    }

    /// CAPACITY batches the every-rule runs wrote: none means the capacity
    /// rule was not in force, and the figure means nothing.
    pub fn capacity_flushes(&self) -> u64 {
        let capacity = pb::FlushReason::Capacity as usize;
        (self.rules.iter())
            .map(|run| run.flushes.get(capacity).copied().unwrap_or(0))
            .sum()
    }
}

/// Redis CPU per item over several runs: their Redis CPU time over all the
/// items they added, in µs. None when a run's Redis CPU could not be read
/// or nothing was added.
pub fn pooled_us_per_item(runs: &[Ingest]) -> Option<f64> {
    let mut secs = 0.0;
    for run in runs {
        secs += run.cpu.seconds("redis")?;
    }
    let added: u64 = runs.iter().map(|run| run.stats.added).sum();
    (added > 0).then(|| secs * 1e6 / added as f64)
}

/// Items per second over several runs: the mean of their rates.
pub fn mean_per_sec(runs: &[Ingest]) -> f64 {
    let sum: f64 = runs.iter().map(|run| run.stats.per_sec()).sum();
    sum / runs.len().max(1) as f64
}

/// The every-rule run: scenario 1's load under `pr-*`, with parcels.
pub async fn rules_add_many(t: &Target, s: &Sizes, run: &str) -> Result<Ingest, String> {
    ingest::add_many_load(t, s, run, RULES_SCENARIO, parcel).await
}

/// One parcel: the standard item with a weight and a volume, and now and
/// then a deadline.
fn parcel(rng: &mut Rng, key: String, id: String) -> pb::AddRequest {
    let mut request = add_request(key, id);
    let item = request.item.as_mut().expect("add_request makes an item");
    let mut draw = |range: &Range<u64>| range.start + rng.below(range.end - range.start);
    item.measures = [
        ("weight_g".to_string(), draw(&WEIGHT_G)),
        ("volume_cm3".to_string(), draw(&VOLUME_CM3)),
    ]
    .into_iter()
    .collect();
    if draw(&(0..DEADLINE_ONE_IN)) == 0 {
        let at = now_micros() + draw(&DEADLINE_AHEAD_S) * 1_000_000;
        item.deadline = Some(prost_types::Timestamp {
            seconds: (at / 1_000_000) as i64,
            nanos: (at % 1_000_000 * 1000) as i32,
        });
    }
    request
}
