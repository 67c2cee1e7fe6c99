// The frozen floor scripts (bench/floor/) under AddMany's load, driven as
// bullmq.mjs drives BullMQ: the same client library (ioredis, one shared
// connection), the same closed loop, warm-up and window, and redis-server's
// user+sys CPU (/proc/PID/stat) read at the window's edges. It gives the
// sitting of bench/peer/run a floor in Redis CPU time beside BullMQ's
// addBulk and batcher's scenario 1.
//
// 16 callers each loop one EVALSHA of 100 items, all of one shard (as a
// shard's add call of scenario 1, which merges what queued for the shard):
// the shard drawn at random of 16, each item's key at random of the shard's
// 625 of 10k 15-byte keys, a fresh 25-byte id and a 32-byte payload. Groups
// flush at 10 items, due after 60 s (none falls due in the window).
//
//   node floor.mjs --redis-port P --redis-pid PID
//     --script floor.lua|floor_dedup.lua|floor_batch.lua|floor_fields.lua|floor_counters.lua
//     [--callers 16] [--bulk 100] [--seconds 10] [--warmup 1] [--fcall 1] [--spread S]
//
// Every script but floor.lua gets the shard's flushed set and a 10-minute
// window, the service's default. Prints one line of JSON.
//
// With --fcall 1 the script runs as a function (FCALL) of a library of its
// own in Redis's functions VM, where batcher's library lives, its globals
// read once a call. Each run draws its own ids, so runs may share a Redis.
//
// With --spread S (S of 2, 4, 8 or 16) a call's items are drawn over S
// shards, not one: the shards of one lane (shard s is in lane s mod 16/S,
// the lane drawn at random), as batcher's round writers on one Redis send
// a lane's shards together (2 lanes of 8: --spread 8). The call is then
// one FCALL of a library whose function runs the script once per shard the
// items drew, a section, with that shard's KEYS and ARGV in tables of their
// own, as add_shards runs batcher's add once per shard section; the script's
// text is unchanged, so each section reads Redis's TIME, where add_shards
// reads it once a call. The floor of batcher's call shape under unary Add:
// `--callers 64 --bulk 13 --spread 8` (row 12 of BENCHMARKS.md: about 13
// adds a call at 64 callers).

import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import IORedis from 'ioredis';
import { parseFlags, redisCpu } from './common.mjs';

const flags = parseFlags('floor.mjs');
const script = flags.script ?? 'floor.lua';
const SCRIPTS = ['floor.lua', 'floor_dedup.lua', 'floor_batch.lua', 'floor_fields.lua',
  'floor_counters.lua'];
if (!SCRIPTS.includes(script)) {
  console.error(`floor.mjs: --script must be one of ${SCRIPTS.join(', ')}, not ${script}`);
  process.exit(2);
}
const dedup = script !== 'floor.lua';
const port = Number(flags['redis-port'] ?? 6379);
const pid = flags['redis-pid'] ? Number(flags['redis-pid']) : null;
const callers = Number(flags.callers ?? 16);
const bulk = Number(flags.bulk ?? 100);
const seconds = Number(flags.seconds ?? 10);
const warmup = Number(flags.warmup ?? 1);
const spread = Number(flags.spread ?? 1);

const SHARDS = 16;
const KEYS = 10_000;
const MAX_ITEMS = 10;
const MAX_WAIT_MS = 60_000;
const WINDOW_MS = 600_000;
if (![1, 2, 4, 8, 16].includes(spread)) {
  console.error(`floor.mjs: --spread must be 1, 2, 4, 8 or 16, not ${spread}`);
  process.exit(2);
}

const redis = new IORedis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
const source = readFileSync(new URL(`../floor/${script}`, import.meta.url), 'utf8');
const fcall = flags.fcall === '1' || spread > 1;
let sha = null;
if (spread > 1) {
  // ARGV[1]: the count of sections n, then per section the counts of its
  // KEYS and of its ARGV; then each section's KEYS and ARGV in turn.
  await redis.call('FUNCTION', 'LOAD', 'REPLACE', [
    '#!lua name=floor_lab',
    'local function section(KEYS, ARGV)',
    'local redis, tonumber, string, struct, math, unpack = redis, tonumber, string, struct, math, unpack',
    source,
    'end',
    "redis.register_function('floor_lab', function(keys, args)",
    '  local n = tonumber(args[1])',
    '  local replies, k, a = {}, 0, 1 + 2 * n',
    '  for s = 1, n do',
    '    local nk, na = tonumber(args[2 * s]), tonumber(args[2 * s + 1])',
    '    local K, A = {}, {}',
    '    for i = 1, nk do K[i] = keys[k + i] end',
    '    for i = 1, na do A[i] = args[a + i] end',
    '    replies[s] = section(K, A)',
    '    k, a = k + nk, a + na',
    '  end',
    '  return replies',
    'end)',
  ].join('\n'));
} else if (fcall) {
  await redis.call('FUNCTION', 'LOAD', 'REPLACE', [
    '#!lua name=floor_lab',
    "redis.register_function('floor_lab', function(KEYS, ARGV)",
    'local redis, tonumber, string, struct, math, unpack = redis, tonumber, string, struct, math, unpack',
    source,
    'end)',
  ].join('\n'));
} else {
  sha = await redis.script('LOAD', source);
}
// Three characters of this run's own, in place of the 'id' of the ids.
const run = Math.floor(Math.random() * 36 ** 3).toString(36).padStart(3, '0');

const key = (n) => `bench-k-${String(n).padStart(7, '0')}`;
const payload = 'p'.repeat(32);

// One call's KEYS and ARGV: `bulk` items of one shard, or with --spread
// over the shards of one lane, a section per shard drawn.
function call(caller, seq) {
  if (spread > 1) return spreadCall(caller, seq);
  return shardCall(caller, seq, Math.floor(Math.random() * SHARDS), bulk, seq);
}

function spreadCall(caller, seq) {
  const lanes = SHARDS / spread;
  const lane = Math.floor(Math.random() * lanes);
  const counts = new Map();
  for (let i = 0; i < bulk; i++) {
    const shard = lane + lanes * Math.floor(Math.random() * spread);
    counts.set(shard, (counts.get(shard) ?? 0) + 1);
  }
  const header = [counts.size];
  const keys = [];
  const args = [];
  let at = seq;
  for (const [shard, n] of counts) {
    const [k, a] = shardCall(caller, seq, shard, n, at);
    at += n;
    header.push(k.length, a.length);
    keys.push(...k);
    args.push(...a);
  }
  return [keys, [...header, ...args]];
}

// The KEYS and ARGV of `n` items of `shard`, their ids numbered from `at`.
function shardCall(caller, seq, shard, n, at) {
  const tag = `{floor:${shard}}`;
  const keys = [`${tag}:due`, `${tag}:stream`];
  const args = [MAX_ITEMS, MAX_WAIT_MS];
  if (dedup) {
    keys.push(`${tag}:flushed`);
    args.push(WINDOW_MS);
  }
  const groups = new Map();
  for (let i = 0; i < n; i++) {
    const k = key(shard + SHARDS * Math.floor(Math.random() * (KEYS / SHARDS)));
    let g = groups.get(k);
    if (g === undefined) {
      g = groups.size + 1;
      groups.set(k, g);
      keys.push(`${tag}:g:${k}`);
    }
    args.push(g, `${run}-${String(caller).padStart(4, '0')}-${String(at + i).padStart(16, '0')}`, payload);
  }
  return [keys, args];
}

const now = () => performance.now() / 1000;
const start = now() + warmup;
const end = start + seconds;
let cpuStart = null;
let cpuEnd = null;
const meter = new Promise((resolve) => {
  setTimeout(() => {
    cpuStart = redisCpu(pid);
    setTimeout(() => {
      cpuEnd = redisCpu(pid);
      resolve();
    }, seconds * 1000);
  }, warmup * 1000);
});

let items = 0;
let added = 0;
async function caller(c) {
  let seq = 0;
  while (now() < end) {
    const [keys, args] = call(c, seq);
    seq += bulk;
    const reply = fcall
      ? await redis.call('FCALL', 'floor_lab', keys.length, ...keys, ...args)
      : await redis.evalsha(sha, keys.length, ...keys, ...args);
    const t = now();
    if (t >= start && t < end) {
      items += bulk;
      added += (spread > 1 ? reply.flat() : reply).filter((r) => r !== 0).length;
    }
  }
}
await Promise.all([...Array.from({ length: callers }, (_, c) => caller(c)), meter]);
await redis.quit();

if (added !== items) {
  console.error(`floor.mjs: ${items - added} of ${items} fresh items were not added`);
  process.exit(1);
}
const out = { floor: basename(script, '.lua'), callers, bulk, spread, seconds, items, rate: items / seconds };
if (cpuStart !== null) {
  out.redis_cpu_us_per_item = Number((((cpuEnd - cpuStart) * 1e6) / items).toFixed(2));
}
console.log(JSON.stringify(out));
