//! The per-scenario report: how each scenario's result becomes rows of the
//! table (figure, target, ratio, verdict) and a line of the details.

use super::calls::{AddsPerCall, Level};
use super::charts::{self, Bar};
use super::fanout::Fanout;
use super::ingest::{Ingest, us_per_add};
use super::load;
use super::overload::{OVERLOAD, Overload};
use super::policies::{self, PolicyCost};
use super::precision::Precision;
use super::remembered::Remembered;
use super::report::{Results, Row, Verdict};
use super::scale::{Probe, ScaleResult};

/// The AddMany target on Redis CPU per item, in µs.
const ADD_MANY_REDIS_US: f64 = 8.0;
/// The unary Add target on the service's CPU per add, in µs.
const ADD_SERVICE_US: f64 = 20.0;
/// The timeout-lateness targets (scenario 3), in ms.
const LATENESS_P99_MS: f64 = 5.0;
const LATENESS_MAX_MS: f64 = 25.0;
/// The flush-to-subscriber target (scenario 4) on p99, in ms.
const DELIVERY_P99_MS: f64 = 5.0;
/// The scale target (scenario 5): p99 over many groups / p99 over few.
const SCALE_RATIO: f64 = 1.25;

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub fn ratio(value: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        value / reference
    } else {
        f64::NAN
    }
}

/// A bar of the throughput chart, in items/s.
pub fn bar(results: &mut Results, label: &str, per_sec: f64) {
    results.charts.throughput.push(Bar {
        label: label.into(),
        per_sec,
    });
}

/// The timeout-lateness row, and what else the run saw in the notes.
pub fn precision(results: &mut Results, name: &str, r: &Precision) {
    let (p50, p99, max) = (
        load::ms(&r.lateness, 0.5),
        load::ms(&r.lateness, 0.99),
        r.lateness.max() as f64 / 1000.0,
    );
    results.rows.push(Row::new(
        name,
        format!(
            "p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms, missed {} of {}",
            r.missed, r.groups
        ),
        format!("p99 ≤ {LATENESS_P99_MS} ms, max ≤ {LATENESS_MAX_MS} ms, none missed"),
        "",
        Verdict::of(p99 <= LATENESS_P99_MS && max <= LATENESS_MAX_MS && r.missed == 0),
    ));
    results.charts.lateness = Some(charts::Lateness {
        histogram: r.lateness.clone(),
        p99_target_ms: LATENESS_P99_MS,
        max_target_ms: LATENESS_MAX_MS,
    });
    results.notes.push(format!(
        "3. Timeout precision: {} groups opened in {:.1} s, {} batches received, \
         {} duplicate batches, {} early or non-TIMEOUT batches; CPU over the run {}{}.",
        r.groups, r.open_secs, r.received, r.duplicates, r.anomalies, r.cpu, r.open_errors
    ));
}

/// The rows of scenarios 5, 6 and 7 (those --only asks for), and the notes.
pub fn scale(results: &mut Results, name: &str, r: &ScaleResult, streaming_rss: Option<u64>) {
    let (small, large) = (
        load::ms(&r.probe_small.latency, 0.99),
        load::ms(&r.probe_large.latency, 0.99),
    );
    let scale_ratio = ratio(large, small);
    if results.wants("5") {
        results.rows.push(Row::new(
            name,
            format!("p99 {large:.2} ms vs {small:.2} ms"),
            format!("ratio ≤ {SCALE_RATIO}"),
            format!("{scale_ratio:.2}×"),
            Verdict::of(scale_ratio <= SCALE_RATIO),
        ));
        results.charts.scale = Some(scale_points(r));
    }
    let per_group = (r.memory_after as f64 - r.memory_before as f64) / (r.large - r.small) as f64;
    if results.wants("6") {
        results.rows.push(Row::new(
            "6. Redis memory per open group",
            format!("{per_group:.0} bytes"),
            "≤ 400 bytes",
            "",
            Verdict::of(per_group <= 400.0),
        ));
    }
    let name = format!("7. service RSS, {}k vs 1k open groups", r.large / 1000);
    match (r.rss_small, r.rss_large) {
        _ if !results.wants("7") => {}
        (Some(rss_small), Some(rss_large)) => {
            let rss_ratio = ratio(rss_large as f64, rss_small as f64);
            results.rows.push(Row::new(
                name,
                format!(
                    "{} vs {}; {} after ingesting them; {} streaming to 100 subscribers",
                    mib(rss_large),
                    mib(rss_small),
                    r.rss_after_ingest.map_or("n/a".into(), mib),
                    streaming_rss.map_or("n/a".into(), mib)
                ),
                "must not grow with open groups (≤ 1.25×)",
                format!("{rss_ratio:.2}×"),
                Verdict::of(rss_ratio <= 1.25),
            ));
        }
        _ => results.rows.push(Row::new(
            name,
            "n/a (external service)",
            "report",
            "",
            Verdict::Info,
        )),
    }
    results.notes.push(scale_note(r));
}

/// The p99s of scenario 5's chart: fresh services, and the service that
/// opened the groups, on the way and at the end.
fn scale_points(r: &ScaleResult) -> charts::ScalePoints {
    let p99_at = |groups: usize, p: &Probe| (groups, load::ms(&p.latency, 0.99));
    let mut opening: Vec<(usize, f64)> = r.on_the_way.iter().map(|(g, p)| p99_at(*g, p)).collect();
    opening.push(p99_at(r.large, &r.probe_after_ingest));
    charts::ScalePoints {
        fresh: vec![
            p99_at(r.small, &r.probe_small),
            p99_at(r.large, &r.probe_large),
        ],
        opening,
        target_ratio: SCALE_RATIO,
    }
}

/// The details of scenarios 5 to 7.
fn scale_note(r: &ScaleResult) -> String {
    let p50 = |p: &Probe| load::ms(&p.latency, 0.5);
    let p99 = |p: &Probe| load::ms(&p.latency, 0.99);
    let on_the_way: Vec<String> = r
        .on_the_way
        .iter()
        .map(|(groups, p)| format!("p99 {:.2} ms at {}k", p99(p), groups / 1000))
        .collect();
    format!(
        "5-7. Groups {}k → {}k opened at {:.0} groups/s (CPU {}). Add latency on a fresh \
         service: p50 {:.2} ms, p99 {:.2} ms at 1k; p50 {:.2} ms, p99 {:.2} ms at {}k. On the \
         service that had just opened them: p50 {:.2} ms, p99 {:.2} ms (on the way: {}). \
         Redis time per script call (add or remove) during these probes: {:.1} µs, {:.1} µs, \
         {:.1} µs. Redis used_memory {:.1} MiB → {:.1} MiB.",
        r.small / 1000,
        r.large / 1000,
        r.fill_per_sec,
        r.fill_cpu,
        p50(&r.probe_small),
        p99(&r.probe_small),
        p50(&r.probe_large),
        p99(&r.probe_large),
        r.large / 1000,
        p50(&r.probe_after_ingest),
        p99(&r.probe_after_ingest),
        if on_the_way.is_empty() {
            "none".into()
        } else {
            on_the_way.join(", ")
        },
        r.probe_small.redis_us_per_call,
        r.probe_large.redis_us_per_call,
        r.probe_after_ingest.redis_us_per_call,
        r.memory_before as f64 / 1048576.0,
        r.memory_after as f64 / 1048576.0,
    )
}

/// "Redis CPU 13.7 µs/item", or n/a when Redis's CPU could not be read.
fn redis_cpu(r: &Ingest) -> String {
    match r.redis_us_per_item() {
        Some(us) => format!("Redis CPU {us:.1} µs/item"),
        None => "Redis CPU n/a (external Redis)".into(),
    }
}

/// Scenario 1's throughput row (a reference figure), its Redis-CPU-per-item
/// row, and its notes.
pub fn add_many(results: &mut Results, name: &str, r: &Ingest) {
    let per_sec = r.stats.per_sec();
    bar(results, "1. AddMany, 100 items/call", per_sec);
    results.rows.push(Row::new(
        name,
        format!("{per_sec:.0} items/s; {}", redis_cpu(r)),
        "reference",
        "",
        Verdict::Info,
    ));
    let target = format!("≤ {ADD_MANY_REDIS_US:.0} µs");
    results.rows.push(match r.redis_us_per_item() {
        Some(us) => Row::new(
            "1b. Redis CPU per item, AddMany",
            format!("{us:.1} µs"),
            target,
            "",
            Verdict::of(us <= ADD_MANY_REDIS_US),
        ),
        None => Row::new(
            "1b. Redis CPU per item, AddMany",
            "n/a (external Redis)",
            target,
            "",
            Verdict::Info,
        ),
    });
    results.notes.push(format!(
        "1. AddMany: {}{}.",
        add_many_summary(r),
        r.stats.error_note()
    ));
}

/// "91300 items in 2 s, call latency p50 ..., p99 ...; CPU ...; Redis CPU
/// ... µs/item": an AddMany run, for the notes.
fn add_many_summary(r: &Ingest) -> String {
    format!(
        "{} items in {:.0} s, call latency p50 {:.1} ms, p99 {:.1} ms; CPU {}; {}",
        r.stats.added,
        r.stats.window.as_secs_f64(),
        load::ms(&r.stats.latency, 0.5),
        load::ms(&r.stats.latency, 0.99),
        r.cpu,
        redis_cpu(r),
    )
}

/// Scenario 11's row (Redis CPU per item with every rule on over the plain
/// policy's, each pooled over its runs, and their mean items/s) and its
/// notes. The row passes only if the every-rule runs wrote CAPACITY
/// batches, so the rules were in force.
pub fn policy_cost(results: &mut Results, name: &str, r: &PolicyCost) {
    let us = |runs: &[Ingest]| {
        policies::pooled_us_per_item(runs).map_or("n/a".into(), |us| format!("{us:.1} µs"))
    };
    let capacity_flushes = r.capacity_flushes();
    let per_sec = policies::mean_per_sec(&r.rules);
    bar(results, "11. AddMany, every policy rule on", per_sec);
    let (ratio, verdict) = match r.ratio() {
        Some(x) => (
            format!("{x:.2}×"),
            Verdict::of(x <= policies::MAX_RATIO && capacity_flushes > 0),
        ),
        None => ("n/a".into(), Verdict::Info),
    };
    results.rows.push(Row::new(
        name,
        format!(
            "{} vs {} plain; {:.0} vs {:.0} items/s",
            us(&r.rules),
            us(&r.plain),
            per_sec,
            policies::mean_per_sec(&r.plain)
        ),
        format!("≤ {}× plain, with CAPACITY flushes", policies::MAX_RATIO),
        ratio,
        verdict,
    ));
    let run = |label: &str, i: &Ingest| {
        format!(
            "{label}: {}; batches by reason {}{}",
            add_many_summary(i),
            i.flush_shares(),
            i.stats.error_note()
        )
    };
    let warning = if capacity_flushes == 0 {
        " The every-rule runs wrote no CAPACITY batch: the rules were not in force."
    } else {
        ""
    };
    let (mut plain, mut rules) = (r.plain.iter().enumerate(), r.rules.iter().enumerate());
    let runs: Vec<String> = (policies::ORDER.iter())
        .filter_map(|every_rule| match every_rule {
            true => rules
                .next()
                .map(|(n, i)| run(&format!("Every-rule run {}", n + 1), i)),
            false => plain
                .next()
                .map(|(n, i)| run(&format!("Plain run {}", n + 1), i)),
        })
        .collect();
    results.notes.push(format!(
        "11. Every policy rule on, in the order the runs ran. {}.{warning}",
        runs.join(". ")
    ));
}

/// "service CPU 14.2 µs/add", or n/a when the service's CPU could not be read.
fn service_cpu(us: Option<f64>) -> String {
    match us {
        Some(us) => format!("service CPU {us:.1} µs/add"),
        None => "service CPU n/a (external service)".into(),
    }
}

/// Scenario 2's row (throughput, latency, Redis CPU per item: a reference
/// figure), its service-CPU-per-add row, and its notes.
pub fn add(results: &mut Results, name: &str, r: &Ingest) {
    let per_sec = r.stats.per_sec();
    bar(results, "2. unary Add, one item/call", per_sec);
    results.rows.push(Row::new(
        name,
        format!(
            "{per_sec:.0} adds/s (p50 {:.1} ms, p99 {:.1} ms); {}",
            load::ms(&r.stats.latency, 0.5),
            load::ms(&r.stats.latency, 0.99),
            redis_cpu(r)
        ),
        "reference",
        "",
        Verdict::Info,
    ));
    let target = format!("≤ {ADD_SERVICE_US:.0} µs");
    results.rows.push(match r.service_us_per_item() {
        Some(us) => Row::new(
            "2b. service CPU per add, unary Add",
            format!("{us:.1} µs"),
            target,
            "",
            Verdict::of(us <= ADD_SERVICE_US),
        ),
        None => Row::new(
            "2b. service CPU per add, unary Add",
            "n/a (external service)",
            target,
            "",
            Verdict::Info,
        ),
    });
    results.notes.push(format!(
        "2. Add: {} adds in {:.0} s; CPU {}; {}; {}{}.",
        r.stats.added,
        r.stats.window.as_secs_f64(),
        r.cpu,
        redis_cpu(r),
        service_cpu(r.service_us_per_item()),
        r.stats.error_note()
    ));
}

/// A row of ours beside a frozen service floor under the same load: our
/// CPU figure `us` over the floor's, with both rates (in `per`).
fn over_floor(
    name: &str,
    us: Option<f64>,
    floor_us: Option<f64>,
    ours: Option<&Ingest>,
    floor: &Ingest,
    per: &str,
) -> Row {
    let (Some(us), Some(floor_us)) = (us, floor_us) else {
        return Row::new(name, "n/a", "reference", "", Verdict::Info);
    };
    Row::new(
        name,
        format!(
            "{us:.1} µs vs {floor_us:.1} µs; {:.0} vs {:.0} {per}",
            ours.map_or(0.0, |o| o.stats.per_sec()),
            floor.stats.per_sec()
        ),
        "reference",
        format!("{:.2}×", us / floor_us),
        Verdict::Info,
    )
}

/// Row 2c: the service's CPU per add and rate beside the frozen service
/// floor's under the same load (a ratio to code ours cannot move), and its note.
pub fn service_floor(results: &mut Results, floor: &Ingest, ours: Option<&Ingest>) {
    let name = "2c. service CPU per add over the frozen service floor's";
    let floor_us = floor.service_us_per_item();
    let ours_us = ours.and_then(Ingest::service_us_per_item);
    results
        .rows
        .push(over_floor(name, ours_us, floor_us, ours, floor, "adds/s"));
    results.notes.push(format!(
        "2c. The frozen service floor under scenario 2's load: {} adds in {:.0} s; CPU {}; {}; {}{}.",
        floor.stats.added,
        floor.stats.window.as_secs_f64(),
        floor.cpu,
        redis_cpu(floor),
        service_cpu(floor_us),
        floor.stats.error_note()
    ));
}

/// Row 1c: Redis's CPU per item under scenario 1's load beside the frozen
/// AddMany service floor's (floor script `script`, a ratio to code ours
/// cannot move), and its note.
pub fn add_many_floor(results: &mut Results, script: &str, floor: &Ingest, ours: Option<&Ingest>) {
    let name = format!("1c. Redis CPU per item over the AddMany service floor's ({script})");
    let floor_us = floor.redis_us_per_item();
    let ours_us = ours.and_then(Ingest::redis_us_per_item);
    results
        .rows
        .push(over_floor(&name, ours_us, floor_us, ours, floor, "items/s"));
    results.notes.push(format!(
        "1c. The frozen AddMany service floor ({script}) under scenario 1's load: {}{}.",
        add_many_summary(floor),
        floor.stats.error_note()
    ));
}

/// Scenario 12's row (adds per call, throughput and latency at each level:
/// reference figures) and its notes.
pub fn adds_per_call(results: &mut Results, name: &str, r: &AddsPerCall) {
    let each =
        |f: &dyn Fn(&Level) -> String| r.levels.iter().map(f).collect::<Vec<_>>().join(" / ");
    let idle = r.idle_per_sec;
    results.rows.push(Row::new(
        name,
        format!(
            "adds per call {}; {} adds/s; p50 {} ms, p99 {} ms",
            each(&|l| l
                .adds_per_call(idle)
                .map_or("n/a".into(), |x| format!("{x:.1}"))),
            each(&|l| format!("{:.0}", l.stats.per_sec())),
            each(&|l| format!("{:.2}", load::ms(&l.stats.latency, 0.5))),
            each(&|l| format!("{:.2}", load::ms(&l.stats.latency, 0.99))),
        ),
        "reference",
        "",
        Verdict::Info,
    ));
    let levels: Vec<String> = (r.levels.iter())
        .map(|l| {
            format!(
                "{} caller{} over {} connection{}: {} adds in {:.0} s, {} FCALLs, {:.0} of them \
                 the add path's; CPU {}; {}; {}{}",
                l.callers,
                if l.callers == 1 { "" } else { "s" },
                l.connections,
                if l.connections == 1 { "" } else { "s" },
                l.stats.added,
                l.stats.window.as_secs_f64(),
                l.fcalls,
                l.add_calls(idle),
                l.cpu,
                us_per_add(&l.cpu, "redis", &l.stats).map_or("Redis CPU n/a".into(), |us| format!(
                    "Redis CPU {us:.1} µs/item"
                )),
                service_cpu(us_per_add(&l.cpu, "service", &l.stats)),
                l.stats.error_note()
            )
        })
        .collect();
    results.notes.push(format!(
        "12. Adds per call: with the service idle, {idle:.0} FCALLs/s (the sweepers' due \
         scans, over {:.1} s), taken off each level's FCALLs over its window. {}.",
        r.idle.as_secs_f64(),
        levels.join(". ")
    ));
}

/// Scenario 4's latency row and notes.
pub fn fanout(results: &mut Results, name: &str, r: &Fanout) {
    let p99 = load::ms(&r.latency, 0.99);
    results.rows.push(Row::new(
        name,
        format!("p50 {:.1} ms, p99 {p99:.1} ms", load::ms(&r.latency, 0.5)),
        format!("p99 ≤ {DELIVERY_P99_MS} ms"),
        "",
        Verdict::of(p99 <= DELIVERY_P99_MS),
    ));
    results.charts.delivery = Some((r.latency.clone(), DELIVERY_P99_MS));
    results.notes.push(format!(
        "4. Fan-out: {} batches × {} subscribers, {} of {} deliveries received, max \
         latency {:.1} ms; CPU {}{}.",
        r.batches,
        r.subscribers,
        r.delivered,
        r.batches * r.subscribers as u64,
        r.latency.max() as f64 / 1000.0,
        r.cpu,
        r.errors
    ));
}

/// Scenario 8's reference row, and its cross-check in the notes.
pub fn remembered(results: &mut Results, name: &str, r: &Remembered) {
    results.rows.push(Row::new(
        name,
        format!("{:.0} bytes", r.bytes_per_id()),
        "reference",
        "",
        Verdict::Info,
    ));
    let missing = if r.remembered == r.items {
        String::new()
    } else {
        format!(" (expected {}: every item added was flushed)", r.items)
    };
    results.notes.push(format!(
        "8. Dedup sets: {} items added at {:.0} items/s, all flushed by SIZE; {} ids \
         remembered{missing}; flushed sets {:.2} MiB (MEMORY USAGE). Cross-check: Redis \
         used_memory {:.1} MiB → {:.1} MiB, less {:.1} MiB of stream entries, is {:.0} \
         bytes per item.",
        r.items,
        r.added_per_sec,
        r.remembered,
        r.flushed_set_bytes as f64 / 1048576.0,
        r.memory_before as f64 / 1048576.0,
        r.memory_after as f64 / 1048576.0,
        r.stream_bytes as f64 / 1048576.0,
        r.used_memory_per_item(),
    ));
}

/// The overload target on accepted calls' p99, in ms: half the default
/// per-call deadline, so accepted calls stay well clear of it.
const OVERLOAD_P99_MS: f64 = 1000.0;
/// The overload target on the RSS: its peak over the window's second half
/// at most this × its peak over the first half (see
/// [`Overload::rss_growth`]).
const OVERLOAD_MAX_RSS_GROWTH: f64 = 1.2;

/// The overload row: accepted throughput and latency, refusals, the RSS's
/// peak and whether it stopped growing, and the RSS series in the notes.
pub fn overload(results: &mut Results, name: &str, r: &Overload) {
    let (p50, p99) = (load::ms(&r.latency, 0.5), load::ms(&r.latency, 0.99));
    let accepted_per_sec = r.accepted_items as f64 / r.window.as_secs_f64();
    let growth = r.rss_growth();
    // An external service: its RSS cannot be read, and is not judged.
    let rss_ok = growth.is_none_or(|g| g <= OVERLOAD_MAX_RSS_GROWTH);
    let pass = rss_ok && p99 <= OVERLOAD_P99_MS && r.refused_calls > 0 && r.other_errors == 0;
    results.rows.push(Row::new(
        name,
        format!(
            "{accepted_per_sec:.0} items/s accepted, {:.0}% of calls refused, p50 {p50:.1} ms, \
             p99 {p99:.1} ms, max RSS {} ({} idle; second half's peak {} the first's), \
             {} other errors",
            100.0 * r.refused_share(),
            r.max_rss_kib().map_or("n/a".into(), mib),
            r.idle_rss_kib.map_or("n/a".into(), mib),
            growth.map_or("n/a".into(), |g| format!("{g:.2}×")),
            r.other_errors
        ),
        format!(
            "RSS stops growing (second half's peak ≤ {OVERLOAD_MAX_RSS_GROWTH}× the first's), \
             p99 ≤ {OVERLOAD_P99_MS:.0} ms, refusals > 0, no other errors"
        ),
        format!("{:.2}× capacity", ratio(accepted_per_sec, r.capacity)),
        Verdict::of(pass),
    ));
    let series: Vec<String> = r
        .rss
        .iter()
        .step_by((r.rss.len() / 12).max(1))
        .map(|(t, kib)| format!("{t:.1} s {}", mib(*kib)))
        .collect();
    results.notes.push(format!(
        "10. Overload: capacity {:.0} items/s (closed loop), offered {:.0} items/s \
         ({OVERLOAD}×, open loop, AddMany of 100); {} calls in the window: {} accepted \
         ({} items), {} RESOURCE_EXHAUSTED, {} other{}; {} calls not sent (bench backlog); \
         idle RSS {}; RSS over time: {}.",
        r.capacity,
        r.offered,
        r.calls(),
        r.accepted_calls,
        r.accepted_items,
        r.refused_calls,
        r.other_errors,
        r.first_other
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})")),
        r.skipped,
        r.idle_rss_kib.map_or("n/a".into(), mib),
        series.join(", ")
    ));
}
