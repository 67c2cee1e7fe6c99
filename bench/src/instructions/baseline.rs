//! The baseline file of `batcher-bench instructions`
//! (`bench/instructions.toml`): reading it, writing one, and the table that
//! compares a run with it.

use std::collections::BTreeMap;
use std::path::Path;

use super::Measured;
use super::profiled::{RedisBuild, TOGGLE};

/// How far a checked shape may rise above its baseline: 3%.
pub(super) const MAX_RISE: f64 = 0.03;
/// The target for `every_rule / addmany`.
const MAX_RULES_RATIO: f64 = 1.25;

/// A baseline file: instructions per item by shape, and the Redis they
/// were counted on.
#[derive(serde::Deserialize)]
pub(super) struct Baseline {
    redis_version: String,
    redis_build_id: String,
    per_item: BTreeMap<String, u64>,
}

impl Baseline {
    pub(super) fn read(path: &Path) -> Result<Baseline, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the baseline {}: {e}", path.display()))?;
        toml::from_str(&text)
            .map_err(|e| format!("the baseline {} is malformed: {e}", path.display()))
    }

    pub(super) fn render(measured: &[Measured], redis: &RedisBuild) -> String {
        let mut text = format!(
            "# Redis instructions per added item of batcher's add path, counted by\n\
             # callgrind (`batcher-bench instructions`; see\n\
             # bench/src/instructions/ for the shapes and the method).\n\
             # CI runs `--check` against this file and fails when a shape other than\n\
             # the floor's rises more than {rise:.0}% above its figure here. The floor_*\n\
             # shapes run the scripts of bench/floor/, which never change.\n\
             #\n\
             # Regenerate with\n\
             #   cargo run --bin batcher-bench -- instructions --write bench/instructions.toml\n\
             # The baseline moves only in a commit that says why (the change that moves\n\
             # it, and by how much); counts depend on the Redis build, so a new Redis\n\
             # is a reason too.\n\
             redis_version = \"{version}\"\n\
             redis_build_id = \"{build}\"\n\
             \n\
             [per_item]\n",
            rise = MAX_RISE * 100.0,
            version = redis.version,
            build = redis.build_id,
        );
        for m in measured {
            text += &format!("{} = {}\n", m.name, m.per_item().round() as u64);
        }
        text
    }
}

/// Prints the table and the ratios; returns the checked shapes that rose
/// above their baseline by more than [`MAX_RISE`] (or have none).
pub(super) fn print_table(
    measured: &[Measured],
    baseline: Option<&Baseline>,
    redis: &RedisBuild,
) -> Vec<String> {
    let mut failures = Vec::new();
    println!(
        "\nRedis {} (build {}), instructions counted inside {TOGGLE}:\n",
        redis.version, redis.build_id
    );
    println!(
        "{:<14} {:>6} {:>6} {:>14} {:>10} {:>10} {:>9} {:>8}  batches",
        "shape", "items", "calls", "instructions", "per call", "per item", "baseline", "change"
    );
    for m in measured {
        let base = baseline.and_then(|b| b.per_item.get(m.name).copied());
        let (base_text, change_text) = match base {
            Some(base) => {
                let change = m.per_item() / base as f64 - 1.0;
                if m.checked && change > MAX_RISE {
                    failures.push(format!("{} ({:+.1}%)", m.name, change * 100.0));
                }
                (base.to_string(), format!("{:+.2}%", change * 100.0))
            }
            None => {
                if m.checked && baseline.is_some() {
                    failures.push(format!("{} (not in the baseline)", m.name));
                }
                ("-".to_string(), "-".to_string())
            }
        };
        let batches: Vec<String> = (m.batches.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        println!(
            "{:<14} {:>6} {:>6} {:>14} {:>10.0} {:>10.0} {:>9} {:>8}  {}{}",
            m.name,
            m.items,
            m.calls,
            m.instructions,
            m.per_call(),
            m.per_item(),
            base_text,
            change_text,
            batches.join(", "),
            match (m.checked, m.name.starts_with("floor")) {
                (true, _) => "",
                (false, true) => " (floor: not checked)",
                (false, false) => " (peer: not checked)",
            }
        );
    }
    print_ratios(measured);
    if let Some(b) = baseline {
        if b.redis_version != redis.version || b.redis_build_id != redis.build_id {
            println!(
                "\nNOTE: the baseline was counted on Redis {} (build {}), this run on {} (build {}): \
                 instruction counts of different builds differ, so regenerate the baseline if \
                 the Redis in use has changed.",
                b.redis_version, b.redis_build_id, redis.version, redis.build_id
            );
        }
        println!(
            "\nChecked shapes may rise at most {:.0}% above the baseline.",
            MAX_RISE * 100.0
        );
    }
    failures
}

/// The spread of the floor shapes' starts, and the ratios between shapes.
fn print_ratios(measured: &[Measured]) {
    for m in measured {
        if let Some((starts, spread)) = m.spread {
            println!(
                "{}: the median of {starts} Redis starts, which spread {:.2}% (Redis's \
                 per-start hash seed)",
                m.name,
                spread * 100.0
            );
        }
    }
    let per_item = |name: &str| {
        measured
            .iter()
            .find(|m| m.name == name)
            .map(Measured::per_item)
    };
    let ratio = |a: &str, b: &str| Some(per_item(a)? / per_item(b)?);
    println!();
    if let Some(r) = ratio("every_rule", "addmany") {
        println!(
            "every_rule / addmany      = {r:.3}  (target ≤ {MAX_RULES_RATIO}: {})",
            if r <= MAX_RULES_RATIO {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    if let Some(r) = ratio("floor_rules", "floor_dedup") {
        println!("floor_rules / floor_dedup = {r:.3}  (the same rules at the floor)");
    }
    for (a, b) in [
        ("addmany", "floor_addmany"),
        ("unary", "floor_unary"),
        ("every_rule", "floor_addmany"),
        ("addmany", "floor_dedup"),
        ("addmany", "floor_batch"),
        ("floor_batch", "floor_dedup"),
        ("addmany", "floor_fields"),
        ("floor_fields", "floor_dedup"),
        ("addmany", "floor_counters"),
        ("floor_counters", "floor_fields"),
        ("unary", "floor_batch_unary"),
        ("rounds", "floor_batch_unary"),
        ("rounds", "floor_rounds"),
        ("floor_rounds", "floor_batch_unary"),
        ("every_rule", "floor_rules"),
        ("addmany", "bullmq_addbulk"),
        ("sharded", "bullmq_addbulk"),
        ("unary", "bullmq_add"),
        ("floor_addmany", "bullmq_addbulk"),
        ("floor_unary", "bullmq_add"),
        ("floor_dedup", "bullmq_addbulk"),
        ("floor_batch", "bullmq_addbulk"),
        ("floor_fields", "bullmq_addbulk"),
        ("floor_counters", "bullmq_addbulk"),
        ("floor_batch_unary", "bullmq_add"),
        ("floor_rounds", "bullmq_add"),
    ] {
        if let Some(r) = ratio(a, b) {
            println!("{:<25} = {r:.2}", format!("{a} / {b}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_baseline_reads_back() {
        let measured = vec![Measured {
            name: "addmany",
            checked: true,
            items: 10,
            calls: 1,
            instructions: 12_345,
            batches: BTreeMap::new(),
            spread: None,
        }];
        let redis = RedisBuild {
            version: "7.0.15".into(),
            build_id: "abc".into(),
        };
        let text = Baseline::render(&measured, &redis);
        let back: Baseline = toml::from_str(&text).expect("parses");
        assert_eq!(back.per_item.get("addmany"), Some(&1235));
        assert_eq!(back.redis_version, "7.0.15");
    }
}
