//! The ceiling: raw Redis running the service's own add script, driven by
//! `redis-benchmark` against the same `redis-server` as the service scenarios.
//!
//! Each call is `EVALSHA` of `batcher::scripts::ADD_ITEMS` with the argument
//! list that `batcher::store::AddArgs` (the builder the store's shard writers
//! use) makes for a single item: KEYS are one shard's due set, stream and
//! flushed set plus the group's hash, ARGV is the dedup window, the group
//! count 1, the key, `max_items`, `max_wait` and `max_bytes` of the ingest
//! policy, then group number 1, the item id and a 32-byte payload.
//!
//! Keys and ids vary through `-r 10000` and `__rand_int__`. redis-benchmark
//! draws every `__rand_int__` occurrence independently (each one is a
//! separate `random() % keyspacelen`), so the key inside the group hash name
//! and the key argument cannot carry the same number. The group hashes are
//! then self-consistent (ten items each, then a SIZE flush that writes the
//! batch and deletes the hash), and only the due-set member that opening ZADDs
//! and flushing ZREMs is a different one of the same ~10k keys: the script runs
//! the same commands against structures of the same size. The id is two
//! draws, so (key, id) pairs come from 10^12 values and every call adds; each
//! run checks that by counting the items it left in Redis. Every run uses a
//! fresh key prefix, so the runs and the service scenarios never see each
//! other's ids.

use std::time::Duration;

use batcher::keys::Keyspace;
use batcher::policy::Policy;
use batcher::store::AddArgs;

use super::procs::{CpuMeter, die_with_parent};

/// Clients of the ceiling runs.
const CLIENTS: usize = 50;
/// Range of each `__rand_int__`: the 10k keys of the ingest scenarios.
const KEYS: u64 = 10_000;

/// One redis-benchmark run.
pub struct Run {
    /// Calls (= items added) per second.
    pub ops_per_sec: f64,
    /// The command line, for the report.
    pub command: String,
    /// Calls made, and items found added afterwards.
    pub issued: u64,
    pub added: u64,
    /// CPU use of redis-server during the run, when the bench owns it.
    pub cpu: String,
}

/// Both ceilings.
pub struct Ceiling {
    pub unpipelined: Run,
    pub pipelined: Run,
}

/// The ingest policy and dedup window the service scenarios run with, so the
/// script does the same work in both.
pub struct ScriptArgs {
    pub policy: Policy,
    pub dedup: Duration,
}

/// Runs redis-benchmark without pipelining and with `-P 16`, each sized by a
/// short calibration run to last about `seconds`.
pub async fn run(
    url: &str,
    redis_pid: Option<u32>,
    args: &ScriptArgs,
    seconds: f64,
    run_tag: &str,
) -> Result<Ceiling, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let sha = batcher::scripts::ADD_ITEMS
        .load_async(&mut conn)
        .await
        .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
    if sha != batcher::scripts::ADD_ITEMS.get_hash() {
        return Err(format!(
            "SCRIPT LOAD returned {sha}, expected {}",
            batcher::scripts::ADD_ITEMS.get_hash()
        ));
    }
    let ctx = Context {
        url,
        sha: &sha,
        args,
        redis_pid,
        seconds,
    };
    let unpipelined = ctx
        .measure(&mut conn, 1, 20_000, &format!("benchceil-{run_tag}-1"))
        .await?;
    let pipelined = ctx
        .measure(&mut conn, 16, 50_000, &format!("benchceil-{run_tag}-16"))
        .await?;
    Ok(Ceiling {
        unpipelined,
        pipelined,
    })
}

struct Context<'a> {
    url: &'a str,
    sha: &'a str,
    args: &'a ScriptArgs,
    redis_pid: Option<u32>,
    seconds: f64,
}

impl Context<'_> {
    /// A calibration run of `calibrate` calls, then a run sized to last
    /// `seconds`, then the count of what it added.
    async fn measure(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        pipeline: u64,
        calibrate: u64,
        prefix: &str,
    ) -> Result<Run, String> {
        let probe = self
            .benchmark(&format!("{prefix}-calibrate"), pipeline, calibrate)
            .await?;
        let wanted = (probe.ops_per_sec * self.seconds) as u64;
        let n = wanted.clamp(calibrate, 20_000_000).div_ceil(pipeline) * pipeline;
        let mut run = self.benchmark(prefix, pipeline, n).await?;
        run.added = count_added(conn, prefix).await?;
        Ok(run)
    }

    /// redis-benchmark's arguments for `n` calls under `prefix`: the add
    /// script's KEYS and ARGV for one item, as the store builds them.
    fn command_args(&self, prefix: &str, pipeline: u64, n: u64) -> Result<Vec<String>, String> {
        let (url, sha, args) = (self.url, self.sha, self.args);
        let keyspace = Keyspace::new(prefix, 16);
        // 15-byte keys and 25-byte ids, the sizes the service scenarios use.
        let key = "cl-__rand_int__";
        let payload = "p".repeat(32);
        let mut script = AddArgs::new(&keyspace, 0, args.dedup);
        script.item(
            key,
            &args.policy,
            b"__rand_int__-__rand_int__",
            payload.as_bytes(),
        );
        let (keys, script_args) = script.into_parts();
        let mut argv: Vec<String> = [
            "-u",
            url,
            "-c",
            &CLIENTS.to_string(),
            "-n",
            &n.to_string(),
            "-P",
            &pipeline.to_string(),
            "-r",
            &KEYS.to_string(),
            "--csv",
            "EVALSHA",
            sha,
            &keys.len().to_string(),
        ]
        .map(String::from)
        .into();
        argv.extend(keys);
        for arg in script_args {
            argv.push(String::from_utf8(arg).map_err(|_| "the ceiling's arguments are text")?);
        }
        Ok(argv)
    }

    /// One redis-benchmark invocation of `n` calls under the keyspace prefix `prefix`.
    async fn benchmark(&self, prefix: &str, pipeline: u64, n: u64) -> Result<Run, String> {
        let (url, sha) = (self.url, self.sha);
        let argv = self.command_args(prefix, pipeline, n)?;
        let mut cmd = std::process::Command::new("redis-benchmark");
        cmd.args(&argv)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        die_with_parent(&mut cmd);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let cpu = CpuMeter::start(&[("redis", self.redis_pid)]);
        let output = match cmd.output().await {
            Ok(output) => output,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(
                    "redis-benchmark not found on PATH. Install it (Debian/Ubuntu: \
                        `sudo apt-get install redis-tools`)"
                        .into(),
                );
            }
            Err(e) => return Err(format!("redis-benchmark: {e}")),
        };
        let cpu = cpu.finish().to_string();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "redis-benchmark failed ({}): {} {}",
                output.status,
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        // --csv prints a header and one row: "test","rps","avg_latency_ms",...
        let ops_per_sec = stdout
            .lines()
            .rev()
            .find_map(|line| {
                line.split("\",\"")
                    .nth(1)?
                    .trim_matches('"')
                    .parse::<f64>()
                    .ok()
            })
            .ok_or_else(|| format!("cannot read redis-benchmark's output: {stdout}"))?;
        let shown: Vec<String> = argv
            .iter()
            .map(|a| match a.as_str() {
                a if a == url => "$REDIS_URL".into(),
                a if a == sha => "$SHA".into(),
                a if a.contains(['{', '}', ' ']) || a.is_empty() => format!("'{a}'"),
                a => a.into(),
            })
            .collect();
        Ok(Run {
            ops_per_sec,
            command: format!("redis-benchmark {}", shown.join(" ")),
            issued: n,
            added: 0,
            cpu,
        })
    }
}

/// Items the run under `prefix` added: those flushed (recorded in the shard's
/// flushed set, which keeps them for the dedup window) plus those still open.
async fn count_added(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> Result<u64, String> {
    let keyspace = Keyspace::new(prefix, 16);
    let shard = keyspace.shard(0);
    let err = |e: redis::RedisError| format!("counting the ceiling's adds: {e}");
    let flushed: u64 = redis::cmd("ZCARD")
        .arg(&shard.flushed)
        .query_async(conn)
        .await
        .map_err(err)?;
    let pattern = format!("{}*", keyspace.group(0, ""));
    let mut cursor: u64 = 0;
    let mut open = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(err)?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("HGET").arg(key).arg("n");
            }
            let sizes: Vec<Option<u64>> = pipe.query_async(conn).await.map_err(err)?;
            open += sizes.into_iter().flatten().sum::<u64>();
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(flushed + open)
}
