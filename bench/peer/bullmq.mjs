// BullMQ producer load, the peer yardstick beside batcher-bench's rows 1 and 2.
//
// Closed loop, as batcher-bench's: N concurrent callers each loop
// `queue.addBulk(100 jobs)` (mode addBulk) or `queue.add(name, data)` (mode
// add) for a warm-up, then a measured window. A call counts if it completes
// inside the window; redis-server's user+sys CPU (/proc/PID/stat) is read at
// the window's edges. No worker runs: only the add path is measured, with
// BullMQ's default job options (what a plain producer gets).
//
// Jobs are shaped like the bench's items: name = one of 10k 15-byte keys,
// data = a 25-byte id and a 32-byte payload.
//
//   node bullmq.mjs --redis-port P --redis-pid PID [--mode addBulk|add]
//     [--callers N] [--connections K] [--bulk 100] [--seconds 10] [--warmup 1]
//
// Prints one line of JSON.
//
// With --count N instead (for `batcher-bench instructions --peer`): no clock
// at all. It adds one job (so BullMQ's scripts are loaded), prints `ready`,
// waits for a line on stdin, then adds N jobs one call at a time (calls of
// --bulk jobs, or single adds), names drawn by a seeded generator over 1,000
// keys, prints one line of JSON and exits.

import { readFileSync } from 'node:fs';
import { Queue } from 'bullmq';
import IORedis from 'ioredis';
import { parseFlags, redisCpu } from './common.mjs';

const flags = parseFlags('bullmq.mjs');
const mode = flags.mode ?? 'addBulk';
if (mode !== 'addBulk' && mode !== 'add') {
  console.error(`bullmq.mjs: --mode must be addBulk or add, not ${mode}`);
  process.exit(2);
}
const port = Number(flags['redis-port'] ?? 6379);
const pid = flags['redis-pid'] ? Number(flags['redis-pid']) : null;
const callers = Number(flags.callers ?? (mode === 'addBulk' ? 16 : 64));
// Queue instances, each with its own ioredis connection; callers are spread
// over them round-robin. 1 (one shared connection) measured best here.
const connections = Number(flags.connections ?? 1);
const bulk = Number(flags.bulk ?? 100);
const seconds = Number(flags.seconds ?? 10);
const warmup = Number(flags.warmup ?? 1);

const KEYS = 10_000;
const version = JSON.parse(
  readFileSync(new URL('./node_modules/bullmq/package.json', import.meta.url)),
).version;

// 15-byte key, 25-byte id, 32-byte payload, as the bench's items.
const key = (n) => `bench-k-${String(n).padStart(7, '0')}`;
const payload = 'p'.repeat(32);
function job(caller, seq) {
  return {
    name: key(Math.floor(Math.random() * KEYS)),
    data: { id: `id-${String(caller).padStart(4, '0')}-${String(seq).padStart(17, '0')}`, payload },
  };
}

if (flags.count !== undefined) {
  await counted(Number(flags.count));
  process.exit(0);
}

// See the header: N jobs, one call at a time, after a `ready` and a line on
// stdin.
async function counted(count) {
  const connection = new IORedis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
  const queue = new Queue('bench', { connection });
  await queue.waitUntilReady();
  let seed = 0x11572024;
  const next = () => {
    seed ^= seed << 13; seed >>>= 0;
    seed ^= seed >>> 17;
    seed ^= seed << 5; seed >>>= 0;
    return seed;
  };
  const counted_job = (seq) => ({
    name: key(next() % 1000),
    data: { id: `id-0000-${String(seq).padStart(17, '0')}`, payload },
  });
  await queue.add('warm-up', { id: 'warm-up', payload });
  console.log('ready');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  let seq = 0;
  let calls = 0;
  while (seq < count) {
    if (mode === 'addBulk') {
      const batch = [];
      for (let i = 0; i < bulk && seq < count; i++) batch.push(counted_job(seq++));
      await queue.addBulk(batch);
    } else {
      const j = counted_job(seq++);
      await queue.add(j.name, j.data);
    }
    calls++;
  }
  await queue.close();
  await connection.quit();
  console.log(JSON.stringify({ peer: 'bullmq', version, mode, jobs: count, calls }));
}

const queues = [];
for (let i = 0; i < connections; i++) {
  const connection = new IORedis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
  queues.push({ queue: new Queue('bench', { connection }), connection });
}
await Promise.all(queues.map(({ queue }) => queue.waitUntilReady()));

const now = () => performance.now() / 1000;
const start = now() + warmup;
const end = start + seconds;
let cpuStart = null;
let cpuEnd = null;
let ownStart = null;
let ownCpu = null;
const meter = new Promise((resolve) => {
  setTimeout(() => {
    cpuStart = redisCpu(pid);
    ownStart = process.cpuUsage();
    setTimeout(() => {
      cpuEnd = redisCpu(pid);
      const own = process.cpuUsage(ownStart);
      ownCpu = (own.user + own.system) / 1e6;
      resolve();
    }, seconds * 1000);
  }, warmup * 1000);
});

let jobs = 0;
let errors = 0;
let firstError = null;
async function caller(c) {
  const { queue } = queues[c % connections];
  let seq = 0;
  while (now() < end) {
    try {
      let added;
      if (mode === 'addBulk') {
        const batch = [];
        for (let i = 0; i < bulk; i++) batch.push(job(c, seq++));
        added = (await queue.addBulk(batch)).length;
      } else {
        const j = job(c, seq++);
        await queue.add(j.name, j.data);
        added = 1;
      }
      const done = now();
      if (done >= start && done <= end) jobs += added;
    } catch (e) {
      errors++;
      firstError ??= String(e);
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}
await Promise.all(Array.from({ length: callers }, (_, c) => caller(c)));
await meter;
await Promise.all(queues.map(({ queue }) => queue.close()));
await Promise.all(queues.map(({ connection }) => connection.quit()));

const cpu = cpuStart === null || cpuEnd === null ? null : cpuEnd - cpuStart;
const round = (x, d) => (x === null ? null : Number(x.toFixed(d)));
const out = {
  peer: 'bullmq',
  version,
  mode,
  callers,
  connections,
  jobs,
  seconds,
  rate: round(jobs / seconds, 0),
  redis_cpu_us_per_job: cpu === null || jobs === 0 ? null : round((cpu * 1e6) / jobs, 1),
  redis_cpu_pct: cpu === null ? null : round((cpu / seconds) * 100, 1),
  // This process's own CPU over the window: near 100 means the client, not
  // Redis, set the rate.
  client_cpu_pct: round((ownCpu / seconds) * 100, 1),
};
if (errors) Object.assign(out, { errors, first_error: firstError });
console.log(JSON.stringify(out));
