//! Scenario 13: the policy store at postcode scale. Over the bench's own
//! Redis, emptied, with `[policy_store]` on:
//! - memory per area: Redis `used_memory` before and after one
//!   ImportPolicies of 100,000 exact areas and 100 globs (quick: 10,000 and
//!   100), divided by the policies imported; and the service's VmRSS with
//!   them over its RSS with the bench's own patterns only;
//! - adds during the import: one caller adds one item after another to the
//!   same instance while it takes the import, on a connection of its own:
//!   the slowest add of that time (the import's work must not hold the
//!   instance's other calls up);
//! - start-up: a fresh service process, from its spawn to its first
//!   accepted Add (adds wait for the store to be loaded), over the big
//!   store and over the small one;
//! - propagation: three service processes; 1,000 changes (quick: 30) of one
//!   area's `max_items`, each made through the first instance, which
//!   returns once the change is in force there; each instance's GetGroup
//!   (which shows the `max_items` in force) is polled every 2 ms until it
//!   shows the new value: p50/p99/max over every (change, instance);
//! - resolution: the service resolves an add's policy in its own memory,
//!   so the add script (and Redis's instructions per item) is the same
//!   whatever the store holds; what the table's size can cost is the
//!   lookup, timed in this process over a million keys drawn from the
//!   areas, with the big table and with the bench's own patterns. The big
//!   table is as a live instance holds it after CHANGED_AREAS single-area
//!   changes: each looks those up first, before the map it shares with the
//!   table the changes started from.

use std::time::{Duration, Instant};

use batcher::config::{Config, KeyPolicy};
use batcher::pb;
use batcher::policy::Policies;
use batcher_testkit::Wait;

use super::load::{self, Client, Rng};
use super::procs::{ServiceProc, rss_kib};
use super::report::{Results, Row, Verdict};
use super::scenarios::used_memory;

/// Start-up target: a service over 100k areas serves adds within this.
const STARTUP_TARGET: Duration = Duration::from_secs(2);
/// Propagation target, p99 over every (change, instance).
const PROPAGATION_TARGET: Duration = Duration::from_secs(1);
/// Resolution target: the big table may cost each add at most this more
/// than the small one: 3% of the 20 µs of service CPU an add may take.
const RESOLVE_TARGET_NS: f64 = 600.0;

/// What scenario 13 measured.
pub struct PolicyStoreRun {
    pub areas: usize,
    pub globs: usize,
    pub import: Duration,
    /// Adds made during the import, and the slowest of them.
    pub adds_during_import: usize,
    pub slowest_add_during_import: Duration,
    pub redis_bytes: u64,
    pub rss_small_kib: u64,
    pub rss_big_kib: u64,
    pub startup_small: Duration,
    pub startup_big: Duration,
    pub changes: usize,
    /// Per (change, instance), in µs.
    pub propagation: Vec<u64>,
    pub resolve_small_ns: f64,
    pub resolve_big_ns: f64,
}

/// The store-on config: the bench's own, with `[policy_store]` on.
fn config_text(base: &str) -> String {
    format!("{base}\n[policy_store]\nenabled = true\ncheck_every = \"100ms\"\n")
}

/// Area `i`'s key: a 15-byte postcode-like key.
fn area(i: usize) -> String {
    format!("pc-area-{i:07}")
}

/// Runs the scenario over `redis_url` (emptied by the caller) with the
/// bench's config `base`.
pub async fn run(redis_url: &str, base: &str, quick: bool) -> Result<PolicyStoreRun, String> {
    let (areas, globs, changes) = if quick {
        (10_000, 100, 30)
    } else {
        (100_000, 100, 1_000)
    };
    let text = config_text(base);
    let (small, startup_small) = start(&text).await?;
    let rss_small_kib = rss_kib(small.pid()).unwrap_or(0);
    let mut client = load::connect(small.addr).await?;
    let memory_before = used_memory(redis_url).await?;
    let prober = load::connect(small.addr).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let probing = tokio::spawn(probe_adds(prober, stop.clone()));
    let began = Instant::now();
    let imported = import(&mut client, areas, globs).await;
    let import_took = began.elapsed();
    stop.cancel();
    let (adds_during_import, slowest_add_during_import) = probing
        .await
        .map_err(|e| format!("the add prober failed: {e}"))??;
    imported?;
    let redis_bytes = used_memory(redis_url).await?.saturating_sub(memory_before);
    drop(small);

    let (big, startup_big) = start(&text).await?;
    let rss_big_kib = rss_kib(big.pid()).unwrap_or(0);
    let (b, _) = start(&text).await?;
    let (c, _) = start(&text).await?;
    let propagation = propagate(&[&big, &b, &c], changes).await?;
    let config = Config::parse(base, "bench").map_err(|e| e.to_string())?;
    let lookups = if quick { 100_000 } else { 1_000_000 };
    let (resolve_small_ns, resolve_big_ns) = resolution(&config, areas, globs, lookups)?;
    Ok(PolicyStoreRun {
        areas,
        globs,
        import: import_took,
        adds_during_import,
        slowest_add_during_import,
        redis_bytes,
        rss_small_kib,
        rss_big_kib,
        startup_small,
        startup_big,
        changes,
        propagation,
        resolve_small_ns,
        resolve_big_ns,
    })
}

/// Starts a service process and times it from spawn to its first accepted Add.
async fn start(text: &str) -> Result<(ServiceProc, Duration), String> {
    let began = Instant::now();
    let service = ServiceProc::start(text).await?;
    let client = load::connect(service.addr).await?;
    let wait = Wait::new("the first add to be accepted", Duration::from_secs(60));
    let first_add = wait.every(Duration::from_millis(2)).until_ok(|| {
        let mut client = client.clone();
        async move {
            let add = load::add_request("pc-ready".into(), "x".into());
            match client.add(add).await {
                Ok(_) => Ok(Ok(())),
                Err(s) if s.code() == tonic::Code::Unavailable => Err(s.to_string()),
                Err(s) => Ok(Err(format!("the first add failed: {s}"))),
            }
        }
    });
    first_add.await.map_err(|e| e.to_string())??;
    Ok((service, began.elapsed()))
}

/// Adds one item after another through `client` until `stop`: how many,
/// and the slowest.
async fn probe_adds(
    mut client: Client,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(usize, Duration), String> {
    let (mut adds, mut slowest) = (0, Duration::ZERO);
    while !stop.is_cancelled() {
        let add = load::add_request("pc-probe".into(), format!("probe-{adds}"));
        let began = Instant::now();
        client
            .add(add)
            .await
            .map_err(|s| format!("an add during the import: {s}"))?;
        slowest = slowest.max(began.elapsed());
        adds += 1;
    }
    Ok((adds, slowest))
}

/// One ImportPolicies of `areas` exact areas and `globs` globs.
async fn import(client: &mut Client, areas: usize, globs: usize) -> Result<(), String> {
    let policy = |name: String, n: usize| pb::Policy {
        name,
        max_items: Some(10 + (n % 20) as u32),
        max_wait: Some(prost_types::Duration {
            seconds: 60 + (n % 600) as i64,
            nanos: 0,
        }),
        ..Default::default()
    };
    let mut policies: Vec<pb::Policy> = (0..areas)
        .map(|i| policy(format!("policies/keys/{}", area(i)), i))
        .collect();
    policies.extend((0..globs).map(|g| policy(format!("policies/keys/pg-{g:03}-*"), g)));
    let req = pb::ImportPoliciesRequest {
        policies,
        reason: "bench: postcode scale".into(),
        ..Default::default()
    };
    let done = client
        .import_policies(req)
        .await
        .map_err(|s| format!("ImportPolicies: {s}"))?;
    let created = done.into_inner().created as usize;
    if created != areas + globs {
        return Err(format!(
            "imported {created} policies, not {}",
            areas + globs
        ));
    }
    Ok(())
}

/// `max_items` in force for `key` on one instance (GetGroup of its open
/// group, opened again when its window has closed it).
async fn max_items(client: &mut Client, key: &str) -> Result<u32, String> {
    let req = pb::GetGroupRequest { key: key.into() };
    for _ in 0..2 {
        let group = client
            .get_group(req.clone())
            .await
            .map_err(|s| s.to_string())?;
        if let Some(group) = group.into_inner().group {
            return Ok(group.max_items);
        }
        let id = format!("open-{}", load::now_micros());
        let add = load::add_request(key.into(), id);
        client.add(add).await.map_err(|s| format!("add: {s}"))?;
    }
    Err("no open group".into())
}

/// `changes` changes through the first instance, each timed until every
/// instance applies it; µs per (change, instance).
async fn propagate(services: &[&ServiceProc], changes: usize) -> Result<Vec<u64>, String> {
    let key = area(1);
    let mut clients = Vec::new();
    for s in services {
        clients.push(load::connect(s.addr).await?);
    }
    clients[0]
        .add(load::add_request(key.clone(), "open".into()))
        .await
        .map_err(|s| format!("add: {s}"))?;
    let mut took = Vec::with_capacity(changes * services.len());
    for n in 0..changes {
        let want = 100 + (n % 2) as u32;
        let req = pb::UpdatePolicyRequest {
            policy: Some(pb::Policy {
                name: format!("policies/keys/{key}"),
                max_items: Some(want),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["max_items".into()],
            }),
            reason: format!("bench change {n}"),
        };
        let began = Instant::now();
        clients[0]
            .update_policy(req)
            .await
            .map_err(|s| format!("UpdatePolicy: {s}"))?;
        for (i, client) in clients.iter_mut().enumerate() {
            let at = |e: String| format!("change {n}, instance {i}: {e}");
            while max_items(client, &key).await.map_err(at)? != want {
                if began.elapsed() > Duration::from_secs(30) {
                    return Err(format!("change {n} not in force within 30 s"));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            took.push(began.elapsed().as_micros() as u64);
        }
    }
    took.sort_unstable();
    Ok(took)
}

/// Areas changed one at a time in the big table of the lookup: a live
/// instance's table holds up to 256 such changes in the map it looks up
/// first.
const CHANGED_AREAS: usize = 250;

/// ns per resolve over `lookups` keys drawn from the areas (with one in
/// ten matching a glob instead), with the big table after CHANGED_AREAS
/// single-area changes and with the small one.
fn resolution(
    config: &Config,
    areas: usize,
    globs: usize,
    lookups: usize,
) -> Result<(f64, f64), String> {
    let small = config.policies();
    let mut keys = config.keys.clone();
    let table = |n: usize| KeyPolicy {
        max_items: std::num::NonZeroU32::new(10 + (n % 20) as u32),
        ..Default::default()
    };
    keys.extend((0..areas).map(|i| (area(i), table(i))));
    keys.extend((0..globs).map(|g| (format!("pg-{g:03}-*"), table(g))));
    let mut big = config
        .with_policies(&KeyPolicy::complete(&config.defaults), keys)
        .map_err(|v| v.to_string())?
        .policies();
    for i in 0..CHANGED_AREAS.min(areas) {
        let name = area(i * (areas / CHANGED_AREAS).max(1));
        let policy = config
            .key_policy(&config.defaults, &name, &table(i + 1))
            .map_err(|v| v.to_string())?;
        big = big.with_changes([(name, Some(policy))]);
    }
    let mut rng = Rng::new(13);
    let drawn: Vec<String> = (0..lookups)
        .map(|_| match rng.below(10) {
            0 => format!("pg-{:03}-x{}", rng.below(globs as u64), rng.below(1000)),
            _ => area(rng.below(areas as u64) as usize),
        })
        .collect();
    Ok((time_resolve(&small, &drawn), time_resolve(&big, &drawn)))
}

/// The best of three passes of `table.resolve` over `keys`, in ns per key.
fn time_resolve(table: &Policies, keys: &[String]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let began = Instant::now();
        let mut sum = 0u64;
        for key in keys {
            sum += u64::from(std::hint::black_box(table.resolve(key)).max_items);
        }
        std::hint::black_box(sum);
        best = best.min(began.elapsed().as_nanos() as f64 / keys.len() as f64);
    }
    best
}

/// The scenario's rows and notes.
pub fn report(results: &mut Results, r: &PolicyStoreRun) {
    let policies = (r.areas + r.globs) as f64;
    let scale = format!("{}k areas + {} globs", r.areas / 1000, r.globs);
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    results.rows.push(Row::new(
        format!("13a. start-up over {scale}"),
        format!(
            "{} (bench patterns only: {})",
            secs(r.startup_big),
            secs(r.startup_small)
        ),
        format!("≤ {}", secs(STARTUP_TARGET)),
        format!(
            "{:.2}",
            r.startup_big.as_secs_f64() / STARTUP_TARGET.as_secs_f64()
        ),
        Verdict::of(r.startup_big <= STARTUP_TARGET),
    ));
    let pct = |q: f64| {
        let at = ((r.propagation.len() as f64 * q).ceil() as usize).clamp(1, r.propagation.len());
        r.propagation[at - 1] as f64 / 1000.0
    };
    let (p50, p99) = (pct(0.5), pct(0.99));
    let max = r.propagation.last().copied().unwrap_or(0) as f64 / 1000.0;
    results.rows.push(Row::new(
        format!(
            "13b. policy change in force on 3 instances ({} changes)",
            r.changes
        ),
        format!("p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms"),
        format!("p99 ≤ {} ms", PROPAGATION_TARGET.as_millis()),
        format!("{:.2}", p99 / PROPAGATION_TARGET.as_millis() as f64),
        Verdict::of(p99 <= PROPAGATION_TARGET.as_millis() as f64),
    ));
    let rss_per = (r.rss_big_kib.saturating_sub(r.rss_small_kib) * 1024) as f64 / policies;
    results.rows.push(Row::new(
        format!("13c. memory per area ({scale})"),
        format!(
            "Redis {:.0} bytes, service {:.0} bytes",
            r.redis_bytes as f64 / policies,
            rss_per
        ),
        "reference",
        "",
        Verdict::Info,
    ));
    let extra = r.resolve_big_ns - r.resolve_small_ns;
    results.rows.push(Row::new(
        format!("13d. policy lookup per add, {scale} vs bench patterns"),
        format!(
            "{:.0} ns vs {:.0} ns (+{extra:.0} ns)",
            r.resolve_big_ns, r.resolve_small_ns
        ),
        format!("+ ≤ {RESOLVE_TARGET_NS:.0} ns (3% of 20 µs)"),
        format!("{:.2}", extra.max(0.0) / RESOLVE_TARGET_NS),
        Verdict::of(extra <= RESOLVE_TARGET_NS),
    ));
    results.notes.push(format!(
        "13. Policy store: one ImportPolicies of {} policies took {:.1} s (one caller's {} \
         adds to the same instance meanwhile: the slowest {:.1} ms) and grew Redis \
         used_memory by {:.1} MiB; service VmRSS {:.1} MiB with them, {:.1} MiB with the \
         bench's own patterns. The add script gets the resolved policy, so Redis's \
         instructions per item do not depend on the store's size; the lookup is timed in \
         the bench's process (best of 3 passes over 1M keys, quick: 100k, one in ten matching a glob), \
         the big table after {CHANGED_AREAS} single-area changes, as a live instance holds it.",
        r.areas + r.globs,
        r.import.as_secs_f64(),
        r.adds_during_import,
        r.slowest_add_during_import.as_secs_f64() * 1000.0,
        r.redis_bytes as f64 / 1048576.0,
        r.rss_big_kib as f64 / 1024.0,
        r.rss_small_kib as f64 / 1024.0,
    ));
}
