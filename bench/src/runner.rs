//! Runs the scenarios in order, each on a fresh service under a time limit,
//! and collects their rows and notes; a scenario that cannot run becomes a
//! NOT RUN row and makes the exit status 1.

use std::future::Future;
use std::time::{Duration, Instant};

use super::ingest::Ingest;
use super::report::{Results, Row, Verdict};
use super::scenarios::{Sizes, Target};
use super::service::Env;
use super::{
    calls, cluster, cluster_report, fanout, ingest, overload, policies, policy_store, precision,
    remembered, reports, scale, tracing_cost,
};

/// How a scenario runs: set up, under a time limit, and a NOT RUN row
/// when either fails.
impl Results {
    /// The target of a scenario, or a NOT RUN row when it could not be set up.
    fn setup(&mut self, name: &str, target: Result<Target, String>) -> Option<Target> {
        target.map_err(|e| self.not_run(name, &e)).ok()
    }

    /// Runs a scenario with a time limit; a failure becomes a NOT RUN row.
    async fn attempt<T>(
        &mut self,
        name: &str,
        limit: Duration,
        future: impl Future<Output = Result<T, String>>,
    ) -> Option<T> {
        eprintln!("batcher-bench: {name} ...");
        let started = Instant::now();
        let result = match tokio::time::timeout(limit, future).await {
            Ok(result) => result,
            Err(_) => Err(format!("did not finish within {} s", limit.as_secs())),
        };
        match result {
            Ok(value) => {
                eprintln!(
                    "batcher-bench: {name} done in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                Some(value)
            }
            Err(e) => {
                self.not_run(name, &e);
                None
            }
        }
    }
}

/// Runs every scenario --only lets through.
pub async fn run_all(results: &mut Results, env: &mut Env, sizes: &Sizes, run: &str, quick: bool) {
    let single = run_add_many(results, env, sizes, run).await;
    run_unary(results, env, sizes, run).await;
    let name = format!(
        "3. timeout lateness ({}k groups, due over {} s)",
        sizes.precision_groups / 1000,
        sizes.precision_waits.len() as u64 * sizes.precision_waits[0].as_secs()
    );
    if results.wants("3")
        && let Some(target) = results.setup(&name, env.fresh(true).await)
    {
        let run = precision::timeout_precision(&target, sizes, run);
        if let Some(r) = results.attempt(&name, Duration::from_secs(180), run).await {
            reports::precision(results, &name, &r);
        }
    }
    let streaming_rss = run_fanout(results, env, sizes, run).await;
    run_scale(results, env, sizes, run, streaming_rss).await;
    run_remembered(results, env, sizes, run).await;
    run_overload(results, env, sizes, run).await;
    run_policy_cost(results, env, sizes, run, quick).await;
    run_adds_per_call(results, env, sizes, run, quick).await;
    run_policy_store(results, env, quick).await;
    run_tracing_cost(results, env, sizes, run, quick).await;
    env.service = None;
    run_cluster(results, env, sizes, run, single.as_ref()).await;
}

/// Scenario 2, then the same load on the frozen service floor (row 2c).
async fn run_unary(results: &mut Results, env: &mut Env, sizes: &Sizes, run: &str) {
    let name = "2. ingest via unary Add (64 callers)";
    if !results.wants("2") {
        return;
    }
    let ours = match results.setup(name, env.fresh(true).await) {
        Some(target) => {
            let future = ingest::ingest_add(&target, sizes, run);
            results
                .attempt(name, Duration::from_secs(120), future)
                .await
        }
        None => None,
    };
    if let Some(r) = &ours {
        reports::add(results, name, r);
    }
    let name = "2c. the frozen service floor, scenario 2's load";
    if let Some(target) = results.setup(name, env.floor().await) {
        let future = ingest::ingest_add(&target, sizes, run);
        if let Some(floor) = results
            .attempt(name, Duration::from_secs(120), future)
            .await
        {
            reports::service_floor(results, &floor, ours.as_ref());
        }
    }
}

/// Scenario 1, then the same load on the frozen AddMany service floor (row
/// 1c); returns scenario 1's result for scenario 9 to compare with.
async fn run_add_many(
    results: &mut Results,
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
) -> Option<Ingest> {
    let name = "1. ingest via AddMany (100 items/call, 10k keys)";
    if !results.wants("1") {
        return None;
    }
    let target = results.setup(name, env.fresh(true).await)?;
    let future = ingest::ingest_add_many(&target, sizes, run);
    let r = results
        .attempt(name, Duration::from_secs(120), future)
        .await;
    if let Some(r) = &r {
        reports::add_many(results, name, r);
    }
    let name = "1c. the frozen AddMany service floor, scenario 1's load";
    if let Some(target) = results.setup(name, env.floor_many().await) {
        let future = ingest::ingest_add_many(&target, sizes, run);
        if let Some(floor) = results
            .attempt(name, Duration::from_secs(120), future)
            .await
        {
            let script = crate::floor_serve_many::SCRIPT_NAME;
            reports::add_many_floor(results, script, &floor, r.as_ref());
        }
    }
    r
}

/// Scenario 9, on a cluster of its own, next to scenario 1's single node.
async fn run_cluster(
    results: &mut Results,
    env: &Env,
    sizes: &Sizes,
    run: &str,
    single: Option<&Ingest>,
) {
    let name = "9. ingest via AddMany on a 3-master cluster";
    if !results.wants("9") {
        return;
    }
    if !env.runs_service() {
        results.rows.push(Row::new(
            name,
            "skipped: the bench must start the service itself (no --service)",
            "",
            "",
            Verdict::Info,
        ));
        return;
    }
    let keyspace = env.keyspace();
    let future = cluster::cluster_add_many(sizes, run, &keyspace);
    if let Some(r) = results
        .attempt(name, Duration::from_secs(180), future)
        .await
    {
        let prefix = &env.config.redis.prefix;
        cluster_report::report(results, name, &r, single, &keyspace, prefix);
    }
}

/// Scenario 4; returns the service's peak RSS while streaming.
async fn run_fanout(results: &mut Results, env: &mut Env, sizes: &Sizes, run: &str) -> Option<u64> {
    let name = "4. flush-to-subscriber latency (100 subscribers)";
    if !results.wants("4") {
        return None;
    }
    let target = results.setup(name, env.fresh(true).await)?;
    let future = fanout::fanout(&target, sizes, run);
    let r = results
        .attempt(name, Duration::from_secs(120), future)
        .await?;
    reports::fanout(results, name, &r);
    r.rss_max_kib
}

/// Scenarios 5 to 7, which run together on one growing set of groups.
async fn run_scale(
    results: &mut Results,
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
    streaming_rss: Option<u64>,
) {
    let name = format!(
        "5. Add latency p99, {}k vs 1k open groups",
        sizes.scale_large / 1000
    );
    if ["5", "6", "7"].iter().any(|id| results.wants(id)) {
        let future = scale::scale(env, sizes, run);
        if let Some(r) = results
            .attempt(&name, Duration::from_secs(300), future)
            .await
        {
            reports::scale(results, &name, &r, streaming_rss);
        }
    }
}

/// Scenario 8, on an emptied Redis so that the flushed sets hold only its ids.
async fn run_remembered(results: &mut Results, env: &mut Env, sizes: &Sizes, run: &str) {
    let name = "8. Redis memory per remembered item id";
    if results.wants("8")
        && let Some(target) = results.setup(name, env.fresh(true).await)
    {
        let keyspace = env.keyspace();
        let future = remembered::remembered_ids(&target, sizes, run, &keyspace);
        if let Some(r) = results
            .attempt(name, Duration::from_secs(120), future)
            .await
        {
            reports::remembered(results, name, &r);
        }
    }
}

/// Scenario 13, on an emptied Redis: the policy store at postcode scale.
async fn run_policy_store(results: &mut Results, env: &mut Env, quick: bool) {
    let name = "13. policy store at postcode scale";
    if !results.wants("13") {
        return;
    }
    if env.redis.is_none() || !env.runs_service() {
        let why = "13. Policy store: not run with --redis-url or --service (it starts services of its own over an emptied Redis).";
        results.notes.push(why.into());
        return;
    }
    if let Err(e) = env.empty().await {
        results.not_run(name, &e);
        return;
    }
    let future = policy_store::run(&env.redis_url, &env.config_text, quick);
    if let Some(r) = results
        .attempt(name, Duration::from_secs(600), future)
        .await
    {
        policy_store::report(results, &r);
    }
}

/// Scenario 14: scenario 1's load with every item traced, tracing off and on.
async fn run_tracing_cost(
    results: &mut Results,
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
    quick: bool,
) {
    let name = "14. tracing on: service CPU per traced item";
    if !results.wants("14") {
        return;
    }
    if env.redis.is_none() || !env.runs_service() {
        let why =
            "14. Tracing: not run with --redis-url or --service (it starts services of its own).";
        results.notes.push(why.into());
        return;
    }
    let future = tracing_cost::run(env, sizes, run, quick);
    if let Some(c) = results
        .attempt(name, Duration::from_secs(300), future)
        .await
    {
        tracing_cost::report(results, name, &c);
    }
}

/// Scenario 10, on an emptied Redis: twice the load the service can take.
async fn run_overload(results: &mut Results, env: &mut Env, sizes: &Sizes, run: &str) {
    let name = format!("10. overload: AddMany at {}× capacity", overload::OVERLOAD);
    if results.wants("10")
        && let Some(target) = results.setup(&name, env.fresh(true).await)
    {
        let future = overload::overload(&target, sizes, run);
        if let Some(r) = results
            .attempt(&name, Duration::from_secs(120), future)
            .await
        {
            reports::overload(results, &name, &r);
        }
    }
}

/// Scenario 11: scenario 1's load under the plain policy and with every
/// rule on, in the order of [`policies::ORDER`], each run on a fresh service
/// over an emptied Redis; the smoke run (quick) runs its first two, one of
/// each, which take every code path of the scenario.
async fn run_policy_cost(
    results: &mut Results,
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
    quick: bool,
) {
    let name = "11. every policy rule on: Redis CPU per item";
    if !results.wants("11") {
        return;
    }
    let limit = Duration::from_secs(120);
    let mut cost = policies::PolicyCost {
        plain: Vec::new(),
        rules: Vec::new(),
    };
    let order = &policies::ORDER[..if quick { 2 } else { policies::ORDER.len() }];
    let runs = order.len();
    for (n, &every_rule) in order.iter().enumerate() {
        let label = match every_rule {
            true => format!("{name} (every-rule run, {} of {runs})", n + 1),
            false => format!("{name} (plain run, {} of {runs})", n + 1),
        };
        let Some(target) = results.setup(&label, env.fresh(true).await) else {
            return;
        };
        let ingest = if every_rule {
            let future = policies::rules_add_many(&target, sizes, run);
            results.attempt(&label, limit, future).await
        } else {
            let future = ingest::ingest_add_many(&target, sizes, run);
            results.attempt(&label, limit, future).await
        };
        let Some(ingest) = ingest else {
            return;
        };
        match every_rule {
            true => cost.rules.push(ingest),
            false => cost.plain.push(ingest),
        }
    }
    reports::policy_cost(results, name, &cost);
}

/// Scenario 12, on an emptied Redis: unary Add at 1, 8 and 64 callers, and
/// the adds each call of the add path carried. The idle rate of FCALLs is
/// measured for 2 s (quick: 0.5 s) first.
async fn run_adds_per_call(
    results: &mut Results,
    env: &mut Env,
    sizes: &Sizes,
    run: &str,
    quick: bool,
) {
    let callers: Vec<String> = calls::CALLERS.iter().map(usize::to_string).collect();
    let name = format!("12. unary Add at {} callers", callers.join("/"));
    if results.wants("12")
        && let Some(target) = results.setup(&name, env.fresh(true).await)
    {
        let idle = Duration::from_millis(if quick { 500 } else { 2000 });
        let future = calls::adds_per_call(&target, sizes, run, idle);
        if let Some(r) = results
            .attempt(&name, Duration::from_secs(120), future)
            .await
        {
            reports::adds_per_call(results, &name, &r);
        }
    }
}
