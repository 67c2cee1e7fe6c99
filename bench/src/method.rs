//! The "How each figure is computed" section of BENCHMARKS.md: the
//! scenarios' module docs, told briefly.

/// The method section of BENCHMARKS.md (each scenario's module has the details).
pub const METHOD: &str = "\
- **Yardsticks**: no row is a ratio to a measure made of our own code. Throughput is compared \
  with BullMQ's in the same sitting by `bench/peer/run`, and the add path's cost by \
  `batcher-bench instructions` (Redis instructions per item under callgrind); rows 1 and 2 \
  here are reference figures of this machine and run.
- **1. AddMany**: 16 callers, 4 HTTP/2 connections, calls of 100 items over 10k keys; items \
  added by calls completing in the window / window. Reference, no target.
- **1b. Redis CPU per item**: redis-server's user+system CPU time over the measured window \
  (from `/proc/<pid>/stat`, so only with the bench's own Redis) / the items added by calls \
  completing in that window. Target for AddMany ≤ 8 µs; shown for unary Add too, without a \
  target. **1c**: the same load, on the same Redis emptied again, against the frozen AddMany \
  service floor (`batcher-bench __floor_serve_many`, `floor_serve_many.rs`): tonic's default \
  server serving AddMany alone, each call one `EVALSHA` of a frozen floor script \
  (`bench/floor/floor_counters.lua`, the add of our layout's plain group and nothing else), \
  with no layers, validation, shards or merging. Figure: 1b \
  over the floor's Redis CPU per item, with both rates: what our add costs Redis beyond the \
  least a script of that layout does with a service beside Redis. Reference, no target.
- **2. Add**: 64 callers, 8 connections, one item per call over 10k keys; adds per second and \
  call latency p50/p99. Reference, no target. **2b**: the service's user+system CPU time over \
  the window (`/proc/<pid>/stat`, so only with the bench's own service) / the adds completed \
  in it; target ≤ 20 µs. **2c**: the same load, on the same Redis emptied again, against the \
  frozen service floor (`batcher-bench __floor_serve`, `floor_serve.rs`): tonic's default \
  server and prost's codec serving Add alone, each call one `EVALSHA` of \
  `bench/floor/floor.lua` on one multiplexed redis-rs connection, with no layers, validation, \
  batching or metrics. Figure: 2b over the floor's CPU per add, with both rates; it shows how \
  much of 2b is the stack (tokio, HTTP/2, tonic, redis-rs, the kernel's loopback TCP) on this \
  machine. Reference, no target.
- **3. Timeout lateness**: one-item groups opened evenly within 5 s under 12 globs with \
  max_wait 5 s, 10 s … 60 s, so due times spread over 60 s (quick: 5k groups, 5 globs, \
  1 s … 5 s); lateness = `flushed_at − (opened_at + max_wait)` on the Redis clock, in whole \
  ms, from a Subscribe stream; missed = no batch within 5 s of the last due time.
- **4. Flush to subscriber**: 100 subscribers on their own connections; 100 size-flushes per \
  second; latency = receive time (host clock) − `flushed_at` (Redis clock, same host, whole \
  ms, so figures overstate by up to 1 ms), over every delivery.
- **5. Scale**: 4 probers each Add one item under a fresh key (opening a group) and Remove \
  it, so the number of open groups stays put; p99 Add latency with 1M open one-item groups \
  (quick: 20k) over p99 with 1k, each on a freshly started service. The chart adds the same \
  probe on the service that opened the groups, at 10k, 100k (quick: 10k) and 1M on the way.
- **6. Memory**: (Redis `used_memory` after opening the groups from 1k to 1M − before) / groups \
  opened; each group holds one item: 15-byte key, 25-byte id, 32-byte payload.
- **7. RSS**: VmRSS of a freshly started service after the same probe, over 1k and over 1M \
  open groups (same history, so a difference would be per-group state); also the RSS of the \
  service that ingested the 1M groups, and the peak while streaming to the 100 subscribers of \
  scenario 4.
- **8. Memory per remembered item id**: 200k items (quick: 20k) are added by AddMany calls \
  of 100, ten items under each of 20k fresh keys (max_items 10), so every group flushes by \
  SIZE and every id is remembered for the dedup window in its shard's flushed set. Figure: \
  `MEMORY USAGE <flushed set> SAMPLES 0` summed over the 16 shards / their `ZCARD` total: \
  only the remembered ids, measured by Redis's own allocation sizes (15-byte key, 25-byte \
  id). Reference, no target. Cross-check in the details: (`used_memory` after − before − \
  `MEMORY USAGE` of the shard streams) / items added.
- **9. AddMany on a 3-master cluster**: a local Redis Cluster of 3 masters (no replicas, no \
  persistence) made by `redis-cli --cluster create`, so the default split of the slots \
  (0-5460, 5461-10922, 10923-16383); a fresh service with the same config, `[redis] \
  cluster_nodes` naming the nodes instead of `url`; scenario 1's load unchanged. Items/s as in \
  1, next to row 1 of the same run. Redis CPU per item: the masters' CPU time over the window / \
  items added in it. **9b**: each master's share of the items = ids in the flushed sets of the \
  shards whose slots it owns (its `CLUSTER NODES` `myself` line) after the run / all of them \
  (warm-up included); the details also give its expected share (of the load's 10k keys, those \
  whose shard tag hashes to its slots) and its share of the masters' CPU; target max/min \
  ≤ 1.2. **9c**: each master's CPU over the window / (items added in the window × its share). \
  **9d** is computed, not measured: for 16 to 1024 shards, how many shard tags \
  (`{<prefix>:<n>}`) fall in each master's slots under the default split, and the smallest \
  count with max/min ≤ 1.2, for the bench's prefix and the default one. The projection in the \
  details is arithmetic on the measured cost: one master core takes 1e6 / (µs per item) items/s; \
  a rate needs ⌈rate × µs per item / 1e6⌉ masters with an even spread, times the busiest \
  master's share × masters otherwise. This machine's 2 cores run all 3 masters, the service and \
  the load, so the scenario cannot show the scaling itself.
- **10. Overload**: on a fresh service over an emptied Redis, scenario 1's closed-loop load \
  measures the items/s the service takes (capacity); then AddMany calls of 100 items are sent \
  open-loop at 2× that rate for the window, whatever the replies. Over calls completing in the \
  window: accepted items/s, the share refused RESOURCE_EXHAUSTED, accepted p50/p99, other \
  errors; the service's VmRSS every 100 ms from the open loop's start. Target: the RSS stops \
  growing (its peak over the series' second half ≤ 1.2× its peak over the first; a queue \
  without bound would grow it in step with time, towards 2×), p99 ≤ 1 s (half the default deadline), refusals present, no \
  other errors.
- **11. Every policy rule on**: scenario 1's load eight times in the same run, in the order \
  (a), (b), (b), (a), twice (quick: (a), (b)), each on a fresh service over an emptied Redis: (a) the plain policy \
  (max_items 10, max_wait 1 h); (b) every rule on (`[keys.\"pr-*\"]` in the config below: max_items 10, max_wait 1 h, max_idle 30 min, \
  capacity 27 kg and 54 l, four cutoffs a day in Europe/Berlin, deadline_lead 5 min, \
  min_items 3, max_age 2 h), every item carrying a weight (200–4800 g) and a volume \
  (1–9 l) drawn evenly, so that about half the groups flush by CAPACITY, and one in ten a \
  deadline 10–40 minutes ahead. Figure: Redis CPU µs per item (as 1b) of (b) over (a), each \
  pooled over its four runs (their Redis CPU time over their items, so that a machine that \
  speeds up or slows down meanwhile weighs on both alike), with their mean items/s; the \
  details give each run's batches by reason. Target ≤ 1.3×, and (b) must have written \
  CAPACITY batches.
- **12. Adds per call**: on a fresh service over an emptied Redis, unary Add (as in 2, 10k \
  keys) at 1, 8 and 64 closed-loop callers over 1, 8 and 8 connections, each level for the \
  warm-up and the window (quick: 0.5 s and 2 s). Adds/s and call p50/p99 as in 2. Adds per \
  call = adds completed in the window / the add path's Redis calls in it. Redis counts \
  `FCALL`s in `INFO commandstats` (`cmdstat_fcall`, read at the start and end of the window) \
  without naming the function, so the count also holds the sweepers' due scans \
  (`batcher_due_<hash>`, each shard's every 250 ms); their rate is measured with the service \
  idle for 2 s (quick: 0.5 s) before the first level, and that rate × the window is taken off \
  each level's count. Under load a sweeper may scan a little more often (an add that opens a \
  group during its shard's scan wakes it again), so the figure errs low if anything; at one \
  caller every call carries one add, so it must read 1.0. With `--redis-url`, other clients' \
  FCALLs count too. Reference, no target.
- CPU figures are the user+system time of each process over the measured window, in percent \
  of one core.
";
