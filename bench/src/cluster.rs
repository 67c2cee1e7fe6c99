//! Scenario 9, AddMany on a 3-master Redis Cluster: scenario 1's load
//! (`ingest::ingest_add_many`, unchanged) against a fresh service whose
//! `[redis] cluster_nodes` names a local cluster of 3 masters and no replicas,
//! started by the library's launcher (`redis-cli --cluster create`, so the
//! standard even split of the 16384 slots).
//!
//! Besides throughput it measures how the items spread over the masters, and
//! what each master's CPU costs per item:
//! - **expected share**: of the load's 10k keys, the fraction whose shard's
//!   hash tag hashes to a slot the master owns (`CLUSTER NODES`, its
//!   `myself` line); the load draws keys uniformly, so this is the expected
//!   share of the items;
//! - **item share**: the ids in the flushed sets of the master's shards after
//!   the run (every flushed item's id is remembered there for the dedup
//!   window), over all masters' ids; these are the items actually flushed on
//!   each master, warm-up included;
//! - **CPU share** and **µs per item**: each master's user+system CPU time over
//!   the measured window; µs per item = that time / (items added in the window
//!   × the master's item share).
//!
//! [`spread`] computes, without Redis, how many of N shards each of 3 masters
//! owns under that standard split, for the shard counts of [`SHARD_COUNTS`].

use batcher::embedded::launcher::LaunchError;
use batcher::keys::{Keyspace, cluster_slot};
use batcher_testkit::cluster::{Cluster, ClusterOptions};

use super::ingest::{self, INGEST_KEYS, Ingest};
use super::load::key;
use super::procs::ServiceProc;
use super::scenarios::{Sizes, Target, master_name, redis_connection};
use super::service;

/// Masters of the scenario's cluster.
pub const MASTERS: usize = 3;
/// Redis Cluster's slot count.
const SLOTS: u32 = 16384;
/// The shard counts whose spread over the masters the report gives.
pub const SHARD_COUNTS: [u16; 8] = [16, 32, 48, 64, 128, 256, 512, 1024];
/// The largest max/min share ratio that counts as an even spread.
pub const EVEN: f64 = 1.2;

/// One master of the cluster, and what landed on it.
pub struct MasterLoad {
    /// Its client port.
    pub port: u16,
    /// The shards whose hash tag's slot it owns.
    pub shards: usize,
    /// The share of the load's keys that map to those shards.
    pub key_share: f64,
    /// Ids in its shards' flushed sets after the run.
    pub flushed: u64,
    /// Its CPU seconds over the measured window, when they could be read.
    pub cpu_secs: Option<f64>,
}

/// What scenario 9 measured.
pub struct ClusterIngest {
    pub ingest: Ingest,
    pub masters: Vec<MasterLoad>,
}

impl ClusterIngest {
    /// Each master's share of the flushed items.
    pub fn item_shares(&self) -> Vec<f64> {
        let total: u64 = self.masters.iter().map(|m| m.flushed).sum();
        let total = total.max(1) as f64;
        self.masters
            .iter()
            .map(|m| m.flushed as f64 / total)
            .collect()
    }

    /// Each master's share of the masters' CPU time over the window.
    pub fn cpu_shares(&self) -> Option<Vec<f64>> {
        let secs: Option<Vec<f64>> = self.masters.iter().map(|m| m.cpu_secs).collect();
        let secs = secs?;
        let total: f64 = secs.iter().sum();
        (total > 0.0).then(|| secs.iter().map(|s| s / total).collect())
    }

    /// Each master's CPU µs per item it received in the window.
    pub fn us_per_item(&self) -> Vec<Option<f64>> {
        let added = self.ingest.stats.added as f64;
        self.masters
            .iter()
            .zip(self.item_shares())
            .map(|(m, share)| {
                let items = added * share;
                (items > 0.0).then_some(m.cpu_secs? * 1e6 / items)
            })
            .collect()
    }

    /// All masters' CPU over the window / items added in it: the cluster's
    /// Redis cost per item, comparable with scenario 1b.
    pub fn total_us_per_item(&self) -> Option<f64> {
        let secs: Option<f64> = self.masters.iter().map(|m| m.cpu_secs).sum();
        let added = self.ingest.stats.added;
        (added > 0).then_some(secs? * 1e6 / added as f64)
    }
}

/// Largest share over smallest (infinite when a master gets nothing).
pub fn max_over_min(shares: &[f64]) -> f64 {
    let max = shares.iter().copied().fold(0.0, f64::max);
    let min = shares.iter().copied().fold(f64::INFINITY, f64::min);
    if min > 0.0 { max / min } else { f64::INFINITY }
}

/// The last slot of each master under `redis-cli --cluster create`'s even
/// split: master i gets up to round((i + 1) × 16384 / masters − 1).
fn split_ends(masters: usize) -> Vec<u16> {
    let per = f64::from(SLOTS) / masters as f64;
    (0..masters)
        .map(|i| match i + 1 == masters {
            true => (SLOTS - 1) as u16,
            false => ((i as f64 + 1.0) * per - 1.0).round() as u16,
        })
        .collect()
}

/// How many of `shards` shards under `prefix` each of `masters` masters owns
/// under the standard even split of the slots.
pub fn spread(prefix: &str, shards: u16, masters: usize) -> Vec<usize> {
    let ends = split_ends(masters);
    let keyspace = Keyspace::new(prefix, shards);
    let mut owned = vec![0; masters];
    for shard in 0..shards {
        let slot = cluster_slot(keyspace.tag(shard).as_bytes());
        owned[ends
            .iter()
            .position(|end| slot <= *end)
            .unwrap_or(masters - 1)] += 1;
    }
    owned
}

/// The smallest of [`SHARD_COUNTS`] whose spread over [`MASTERS`] masters is
/// within [`EVEN`], for keys under `prefix`.
pub fn shards_for_even(prefix: &str) -> Option<u16> {
    SHARD_COUNTS.into_iter().find(|n| {
        let owned: Vec<f64> = spread(prefix, *n, MASTERS)
            .into_iter()
            .map(|c| c as f64)
            .collect();
        max_over_min(&owned) <= EVEN
    })
}

/// Scenario 9: starts the cluster and a service on it, runs scenario 1's
/// load, and reads where the items went. Must be awaited from the main
/// future: it spawns the nodes and the service.
pub async fn cluster_add_many(
    s: &Sizes,
    run: &str,
    keyspace: &Keyspace,
) -> Result<ClusterIngest, String> {
    let options = ClusterOptions {
        masters: MASTERS,
        replicas_per_master: 0,
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&options).map_err(|e| match e {
        LaunchError::NotInstalled { .. } => "redis-server not found on PATH".to_string(),
        e => format!("the cluster did not start: {e}"),
    })?;
    let masters = cluster.masters();
    if masters.len() != MASTERS {
        return Err(format!("{} masters, not {MASTERS}", masters.len()));
    }
    let service = ServiceProc::start(&service::cluster_config(&cluster.urls())).await?;
    service::wait_ready(service.addr).await?;
    let target = Target {
        addr: service.addr,
        service_pid: Some(service.pid()),
        redis_pid: None,
        redis_url: masters[0].url().to_owned(),
        masters: masters.iter().filter_map(|m| m.pid()).collect(),
    };
    let ingest = ingest::ingest_add_many(&target, s, run).await?;
    let keys: Vec<u16> = (0..INGEST_KEYS)
        .map(|n| keyspace.shard_of(&key("am", run, n)))
        .collect();
    let mut loads = Vec::with_capacity(MASTERS);
    for (i, master) in masters.iter().enumerate() {
        let owned = owned_slots(master.url()).await?;
        let shards: Vec<u16> = (0..keyspace.shards())
            .filter(|shard| owns(&owned, cluster_slot(keyspace.tag(*shard).as_bytes())))
            .collect();
        let on_master = keys.iter().filter(|shard| shards.contains(shard)).count();
        loads.push(MasterLoad {
            port: master.port().unwrap_or(0),
            shards: shards.len(),
            key_share: on_master as f64 / INGEST_KEYS as f64,
            flushed: flushed_ids(master.url(), keyspace, &shards).await?,
            cpu_secs: ingest.cpu.seconds(&master_name(i)),
        });
    }
    Ok(ClusterIngest {
        ingest,
        masters: loads,
    })
}

/// The slot ranges the node at `url` owns: the slot fields of the `myself`
/// line of its `CLUSTER NODES` (importing and migrating marks skipped).
async fn owned_slots(url: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut conn = redis_connection(url).await?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("CLUSTER NODES on {url}: {e}"))?;
    let line = nodes
        .lines()
        .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
        .ok_or_else(|| format!("CLUSTER NODES on {url} has no myself line"))?;
    Ok(line
        .split(' ')
        .skip(8)
        .filter(|f| !f.starts_with('['))
        .filter_map(|f| {
            let (first, last) = f.split_once('-').unwrap_or((f, f));
            Some((first.parse().ok()?, last.parse().ok()?))
        })
        .collect())
}

fn owns(ranges: &[(u16, u16)], slot: u16) -> bool {
    ranges
        .iter()
        .any(|(first, last)| (*first..=*last).contains(&slot))
}

/// The ids in the flushed sets of `shards`, on the master at `url` that owns them.
async fn flushed_ids(url: &str, keyspace: &Keyspace, shards: &[u16]) -> Result<u64, String> {
    let mut conn = redis_connection(url).await?;
    let mut total = 0;
    for shard in shards {
        let n: u64 = redis::cmd("ZCARD")
            .arg(keyspace.shard(*shard).flushed)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("ZCARD on {url}: {e}"))?;
        total += n;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split matches the ranges `redis-cli --cluster create` gives 3 masters.
    #[test]
    fn split_is_redis_clis() {
        assert_eq!(split_ends(3), vec![5460, 10922, 16383]);
    }

    /// Every shard is owned by exactly one master, whatever the shard count.
    #[test]
    fn spread_counts_every_shard() {
        for n in SHARD_COUNTS {
            assert_eq!(
                spread("bench", n, MASTERS).iter().sum::<usize>(),
                n as usize
            );
        }
    }
}
