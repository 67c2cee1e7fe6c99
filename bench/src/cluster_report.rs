//! Scenario 9's report: its rows (throughput next to the single node, share
//! of the items per master, Redis CPU per item per master, shard counts for
//! an even spread), its details, and the projection from its per-master cost
//! to the masters a given rate needs.

use batcher::config::DEFAULT_REDIS_PREFIX;
use batcher::keys::Keyspace;

use super::cluster::{self, ClusterIngest};
use super::ingest::Ingest;
use super::load;
use super::report::{Results, Row, Verdict};
use super::reports::{self, ratio};
use super::scenarios::master_name;

/// "16: 4/5/7 (1.75×), 32: …" for the shard counts of `cluster::SHARD_COUNTS`.
fn spreads(prefix: &str) -> String {
    cluster::SHARD_COUNTS
        .iter()
        .map(|n| {
            let owned = cluster::spread(prefix, *n, cluster::MASTERS);
            let counts: Vec<f64> = owned.iter().map(|c| *c as f64).collect();
            let split: Vec<String> = owned.iter().map(usize::to_string).collect();
            let ratio = cluster::max_over_min(&counts);
            format!("{n}: {} ({ratio:.2}×)", split.join("/"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// "64 (prefix "bench")", or that none of the counts does.
fn even_at(prefix: &str) -> String {
    match cluster::shards_for_even(prefix) {
        Some(n) => format!("{n} (prefix \"{prefix}\")"),
        None => format!("none up to 1024 (prefix \"{prefix}\")"),
    }
}

/// "33% / 29% / 38%".
fn percents(shares: &[f64]) -> String {
    let parts: Vec<String> = shares
        .iter()
        .map(|s| format!("{:.0}%", s * 100.0))
        .collect();
    parts.join(" / ")
}

/// Scenario 9's rows (throughput, share per master, CPU per item per master,
/// shard counts for an even spread), its details and the projection.
pub fn report(
    results: &mut Results,
    name: &str,
    r: &ClusterIngest,
    single: Option<&Ingest>,
    keyspace: &Keyspace,
    prefix: &str,
) {
    let per_sec = r.ingest.stats.per_sec();
    reports::bar(results, "9. AddMany, 3-master cluster", per_sec);
    let single_per_sec = single.map(|s| s.stats.per_sec());
    let us = |v: Option<f64>| v.map_or("n/a".into(), |us| format!("{us:.1} µs"));
    let single_us = single.and_then(Ingest::redis_us_per_item);
    let figure = match single_per_sec {
        Some(single_per_sec) => format!(
            "{per_sec:.0} items/s vs {single_per_sec:.0} on one node (row 1); Redis CPU {}/item \
             over the masters vs {} on one node",
            us(r.total_us_per_item()),
            us(single_us),
        ),
        None => format!(
            "{per_sec:.0} items/s (run scenario 1 too to compare); Redis CPU {}/item over the \
             masters",
            us(r.total_us_per_item()),
        ),
    };
    results.rows.push(Row::new(
        name,
        figure,
        "reference (2 cores: no 3× here; see the projection)",
        single_per_sec.map_or(String::new(), |s| format!("{:.2}×", ratio(per_sec, s))),
        Verdict::Info,
    ));
    let shares = r.item_shares();
    let spread = cluster::max_over_min(&shares);
    let owned: Vec<String> = r.masters.iter().map(|m| m.shards.to_string()).collect();
    results.rows.push(Row::new(
        format!(
            "9b. share of items per master, {} shards",
            keyspace.shards()
        ),
        format!(
            "{} of the items (shards owned {}; CPU {})",
            percents(&shares),
            owned.join("/"),
            r.cpu_shares().map_or("n/a".into(), |c| percents(&c)),
        ),
        format!("max/min ≤ {}", cluster::EVEN),
        format!("{spread:.2}×"),
        Verdict::of(spread <= cluster::EVEN),
    ));
    let per_master: Vec<String> = r
        .us_per_item()
        .into_iter()
        .enumerate()
        .map(|(i, v)| format!("{} {}", master_name(i), us(v)))
        .collect();
    results.rows.push(Row::new(
        "9c. Redis CPU per item on each master",
        per_master.join(", "),
        "reference",
        "",
        Verdict::Info,
    ));
    results.rows.push(Row::new(
        "9d. shards for max/min ≤ 1.2 over 3 masters (default slot split)",
        format!("{}; {}", even_at(prefix), even_at(DEFAULT_REDIS_PREFIX)),
        "reference",
        "",
        Verdict::Info,
    ));
    cluster_notes(results, r, prefix);
}

/// Scenario 9's details, and the projection from its per-master cost.
fn cluster_notes(results: &mut Results, r: &ClusterIngest, prefix: &str) {
    let shares = r.item_shares();
    let us = r.us_per_item();
    let masters: Vec<String> = r
        .masters
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{} (port {}) owns {} shards, {:.1}% of the load's keys, {} items flushed \
                 ({:.1}%), CPU {}, {}/item",
                master_name(i),
                m.port,
                m.shards,
                m.key_share * 100.0,
                m.flushed,
                shares[i] * 100.0,
                m.cpu_secs.map_or("n/a".into(), |s| format!("{s:.2} s")),
                us[i].map_or("n/a".into(), |us| format!("{us:.1} µs")),
            )
        })
        .collect();
    let s = &r.ingest.stats;
    results.notes.push(format!(
        "9. Cluster AddMany: {} items in {:.0} s, call latency p50 {:.1} ms, p99 {:.1} ms; \
         CPU {}. {}{}.",
        s.added,
        s.window.as_secs_f64(),
        load::ms(&s.latency, 0.5),
        load::ms(&s.latency, 0.99),
        r.ingest.cpu,
        masters.join("; "),
        s.error_note()
    ));
    results.notes.push(format!(
        "9d. Shards each of 3 masters owns under the default slot split (0-5460, 5461-10922, \
         10923-16383), by shard count (max/min): prefix \"{prefix}\": {}; default prefix \
         \"{DEFAULT_REDIS_PREFIX}\": {}. Shard hash tags sit near the middle of equal slot \
         ranges, so the counts differ by at most one and a count divisible by 3 splits evenly; \
         16 shards give 6/5/5 (1.20×), the best 16 can give over 3, so the item share of row 9b \
         lands at 1.20× give or take the spread of the load's keys over the shards.",
        spreads(prefix),
        spreads(DEFAULT_REDIS_PREFIX)
    ));
    if let Some(projection) = projection(r) {
        results.notes.push(projection);
    }
}

/// The rates the projection sizes a cluster for, in items per second.
const RATES: [f64; 3] = [100_000.0, 500_000.0, 1_000_000.0];

/// How many masters (and service cores) given rates need, from this run's
/// Redis CPU per item: a projection, not a measurement.
fn projection(r: &ClusterIngest) -> Option<String> {
    let us = r.total_us_per_item()?;
    let per_core = 1e6 / us;
    let imbalance = r.item_shares().into_iter().fold(0.0, f64::max) * r.masters.len() as f64;
    let service_us = r
        .ingest
        .cpu
        .seconds("service")
        .map(|secs| secs * 1e6 / r.ingest.stats.added.max(1) as f64);
    let needs: Vec<String> = RATES
        .iter()
        .map(|rate| {
            let even = (rate / per_core).ceil();
            let skewed = (rate * imbalance / per_core).ceil();
            let service = service_us.map_or(String::new(), |s| {
                format!(", service cores: {:.0}", (rate * s / 1e6).ceil())
            });
            format!(
                "{:.0}k items/s: {even:.0} masters ({skewed:.0} at this run's spread{service})",
                rate / 1000.0
            )
        })
        .collect();
    Some(format!(
        "9. Projection (computed from the measured cost, not measured): the masters used \
         {us:.1} µs of Redis CPU per item, so one master, on a core of its own, takes about \
         {per_core:.0} items/s. Redis runs commands on one thread, so a cluster's rate is about \
         masters × that, while the busiest master stays under its core: masters needed = \
         ⌈rate × µs per item / 1e6⌉ with an even spread, × the busiest master's share × \
         masters ({imbalance:.2} here) otherwise. {}. This machine has 2 cores for the 3 \
         masters, the service and the load, so it cannot show the scaling itself; the \
         projection assumes each master has a core, enough service instances (the service \
         used {} µs of CPU per item here) and callers to feed them, and a network that is not \
         the limit.",
        needs.join("; "),
        service_us.map_or("n/a".into(), |s| format!("{s:.1}")),
    ))
}
