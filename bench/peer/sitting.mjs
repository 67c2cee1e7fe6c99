// The tables of a sitting of bench/peer/run: every pair's figures beside
// BullMQ's, and with --into BENCHMARKS.md the section of that file that
// judges the add path's targets against BullMQ and the frozen floors, from
// this sitting alone (times) and the instruction counts taken right after it.
//
//   node sitting.mjs --figs F --peer-jsonl F --service F [--machine F]
//     [--instructions F --into BENCHMARKS.md --commit C --pairs N --shards N --worker-threads N]
//
// --figs: one line per pair and shape, "pair shape rate µs peer_rate peer_µs"
// (batcher's or a floor's rate and Redis CPU per item, then the same pair's
// BullMQ run). --service: one line per pair, "pair ours_µs floor_µs", the
// service CPU per unary add of scenario 2 and of the frozen service floor
// under the same load. --machine: one line per pair, "pair ours_busy
// ours_µs floor_busy floor_µs peer_busy peer_µs", the percent of a core
// that every process of the run kept busy and the machine's CPU per unary
// add, of scenario 2, the frozen service floor and BullMQ's add. --instructions: `batcher-bench instructions --peer
// --json`'s file. --shards N: the sitting also ran rows 1 and 2 in N
// shards (bench/peer/run --shards). --worker-threads N: batcher's service
// ran on N threads (bench/peer/run --worker-threads). Prints the every-pair table; with --into, replaces the
// section between the markers that batcher-bench keeps (or puts it before
// "## Charts" when the file has none).

import { readFileSync, writeFileSync } from 'node:fs';
import { parseFlags } from './common.mjs';

const flags = parseFlags('sitting.mjs');
const version = JSON.parse(readFileSync(flags['peer-jsonl'], 'utf8').split('\n')[0]).version;
const rows = readFileSync(flags.figs, 'utf8').trim().split('\n').map((l) => {
  const [pair, shape, ...f] = l.trim().split(/\s+/);
  const [rate, us, peerRate, peerUs] = f.map(Number);
  return { pair, shape, rate, us, peerRate, peerUs, rr: rate / peerRate, cr: us / peerUs };
});
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

const cells = (r) =>
  `| ${r.pair} | ${r.shape} | ${r.rate.toFixed(0)} | ${r.us.toFixed(1)} | ${r.peerRate.toFixed(0)} | ` +
  `${r.peerUs.toFixed(1)} | ${r.rr.toFixed(2)}× | ${r.cr.toFixed(2)}× |`;
const table = [
  `| pair | shape | batcher (or floor) items/s | its Redis µs/item | BullMQ ${version} jobs/s | ` +
    'BullMQ Redis µs/job | rate ratio (to BullMQ) | Redis cost ratio (to BullMQ) |',
  '|---|---|---|---|---|---|---|---|',
  ...rows.map(cells),
];
// Each column's median over the pairs; the ratios are medians of the pairs' ratios.
// BENCHMARKS.md gets these rows only (batcher-bench's headline reads the
// AddMany/addBulk and Add/add ones); stdout and --out get every pair too.
const medians = table.slice(0, 2);
for (const shape of new Set(rows.map((r) => r.shape))) {
  const of = rows.filter((r) => r.shape === shape);
  const m = (k) => median(of.map((r) => r[k]));
  const line = cells({ pair: 'median', shape, rate: m('rate'), us: m('us'), peerRate: m('peerRate'),
    peerUs: m('peerUs'), rr: m('rr'), cr: m('cr') });
  table.push(line);
  medians.push(line);
}
console.log(table.join('\n'));

if (flags.into) {
  const START = '<!-- bench/peer/run writes this section; batcher-bench keeps it -->';
  const END = "<!-- end of bench/peer/run's section -->";
  const section = [START, ...render(), END].join('\n');
  const old = readFileSync(flags.into, 'utf8');
  const [a, b] = [old.indexOf(START), old.indexOf(END)];
  let next;
  if (a >= 0 && b > a) next = old.slice(0, a) + section + old.slice(b + END.length);
  else if (old.includes('\n## Charts')) next = old.replace('\n## Charts', `\n${section}\n\n## Charts`);
  else next = `${old.trimEnd()}\n\n${section}\n`;
  writeFileSync(flags.into, next);
  console.error(`wrote the sitting's section of ${flags.into}`);
}

// The section's lines.
function render() {
  const of = (shape) => rows.filter((r) => r.shape === shape);
  const x = (v) => `${v.toFixed(2)}×`;
  // A ratio beside a target t: to three places where two would round it onto t.
  const near = (t) => (v) => (Math.abs(v - t) < 0.005 && v !== t ? `${v.toFixed(3)}×` : x(v));
  // A shape's figure, pair by pair ("a, b, c").
  const list = (shape, k, fmt = x) => of(shape).map((r) => fmt(r[k])).join(', ');
  const met = (values, ok) => {
    const n = values.filter(ok).length;
    return n === values.length ? 'met in every pair' : n === 0 ? 'not met' : `met in ${n} of ${values.length} pairs`;
  };
  const service = readFileSync(flags.service, 'utf8').trim().split('\n')
    .map((l) => l.trim().split(/\s+/).map(Number));
  const us = (v) => `${v.toFixed(1)} µs`;
  const instr = flags.instructions ? JSON.parse(readFileSync(flags.instructions, 'utf8')) : null;
  const per = (name) => instr?.per_item[name];
  const ratio = (a, b) => (per(a) && per(b) ? per(a) / per(b) : NaN);

  // The pair's figure k of shape.
  const at = (shape, pair, k) => of(shape).find((r) => r.pair === pair)[k];
  // What our library resident costs floor_counters, and that floor with it, pair by pair.
  const library = of('floor_counters/addBulk').map((r) =>
    at('library_kept/addBulk', r.pair, 'us') / at('library_deleted/addBulk', r.pair, 'us'));
  const resident = of('floor_counters/addBulk').map((r, j) => r.cr * library[j]);
  const ours = of('AddMany/addBulk').map((r) => r.cr);
  const served = of('service_floor_many/addBulk').map((r) => r.cr);
  const after = ['', 'AddMany\'s Redis CPU per item, pair by pair, over `floor_counters` alone: ' +
    `${ours.map((v, j) => x(v / of('floor_counters/addBulk')[j].cr)).join(', ')}; over that floor with our ` +
    `library resident: ${ours.map((v, j) => x(v / resident[j])).join(', ')}; over that floor behind the ` +
    `AddMany service floor (row 1c): ${ours.map((v, j) => x(v / served[j])).join(', ')}. What our library ` +
    `resident costs the floor (kept over deleted): ${library.map(x).join(', ')}.`];
  const shaped = of('floor_batch×13/8/add');
  if (shaped.length) {
    after.push('', 'Unary Add\'s Redis CPU per add, pair by pair, over `floor_batch` in batcher\'s call shape ' +
      '(13 adds a call over the 8 shards of a lane, a section per shard: `floor.mjs --callers 64 --bulk 13 ' +
      `--spread 8\`): ${of('Add/add').map((r, j) => x(r.cr / shaped[j].cr)).join(', ')}; that floor over the ` +
      `same 13 adds a call in one shard's section (\`floor_batch×13\`), what the sections cost: ` +
      `${shaped.map((r, j) => x(r.us / of('floor_batch×13/add')[j].us)).join(', ')}.`);
  }
  if (flags.machine) {
    // "pair ours_busy ours_µs floor_busy floor_µs peer_busy peer_µs" (bench/peer/run's service_floor).
    const machine = readFileSync(flags.machine, 'utf8').trim().split('\n')
      .map((l) => l.trim().split(/\s+/).map(Number));
    const each = (k, fmt) => machine.map((m) => fmt(m[k])).join(', ');
    const pct = (v) => `${v.toFixed(0)}%`;
    after.push('', 'The machine\'s CPU per unary add, pair by pair: the CPU time of every process of the run over ' +
      'the window, over the adds (ours and the service floor: Redis, the service and the bench\'s 64 callers; ' +
      `BullMQ's \`add\`: Redis and its Node process): ours ${each(2, us)}, with ${each(1, pct)} of a core busy; ` +
      `the service floor ${each(4, us)}, with ${each(3, pct)}; BullMQ's \`add\` ${each(6, us)}, with ` +
      `${each(5, pct)}. So the service floor's whole stack costs ${machine.map((m) => x(m[4] / m[6])).join(', ')} what BullMQ's \`add\` costs this machine ` +
      'per add, and on two cores shared by every process a rate above BullMQ\'s needs less CPU per add than it. ' +
      `Ours costs ${machine.map((m) => x(m[2] / m[4])).join(', ')} the service floor.`);
  }
  if (flags.shards) {
    const n = flags.shards, many = `AddMany_${n}_shards/addBulk`, unary = `Add_${n}_shards/add`;
    after.push('', `With the service in ${n} shards (\`--shards ${n}\`; rows \`${many}\` and \`${unary}\`, ` +
      'each run in the same pair as the default\'s), pair by pair: AddMany\'s Redis CPU per item ' +
      `${list(many, 'cr')} \`addBulk\`'s (the default's ${list('AddMany/addBulk', 'cr')}) at ` +
      `${list(many, 'rr')} its rate; unary Add's Redis CPU per add ${list(unary, 'cr')} \`add\`'s ` +
      `(the default's ${list('Add/add', 'cr')}) at ${list(unary, 'rr')} its rate ` +
      `(the default's ${list('Add/add', 'rr')}).`);
  }

  const out = [
    '## Against BullMQ and the frozen floors, in one sitting',
    '',
    `\`bench/peer/run --pairs ${flags.pairs}${flags.shards ? ` --shards ${flags.shards}` : ''}` +
      `${flags['worker-threads'] ? ` --worker-threads ${flags['worker-threads']}` : ''}\` at ${flags.commit}, ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, ` +
      `BullMQ ${version}: batcher's scenarios 1 and 2, BullMQ's \`addBulk\` and \`add\` and the frozen floors ` +
      '(`bench/floor/`), alternating, each on a fresh redis-server started the same way. Only ratios within a ' +
      'pair are compared. The floors beside each target are the least that code does in the same pair: ' +
      '`floor_counters` is the add of format 4\'s plain group (its counters, dedup window, batch and due set) ' +
      'and nothing else; "with our library resident" is that floor\'s figure times what our library, ' +
      'resident in the same Lua VM as it is in production, costs it in the same pair: the floor run as a ' +
      'function after 2 s of our add (`batcher-bench __store_load --spread all`) with our library kept, ' +
      'over the same with it deleted (`FUNCTION DELETE`); "behind the AddMany service floor" is `floor_counters` ' +
      'under scenario 1\'s load through `batcher-bench __floor_serve_many` (row 1c), tonic serving one EVALSHA of ' +
      'it per AddMany, so that Redis has a service beside it as ours does; the service floor is ' +
      '`batcher-bench __floor_serve`, tonic serving one EVALSHA of `floor.lua` per Add.',
    '',
    '| target | batcher, pair by pair | the floor beside it, pair by pair | batcher | the floor |',
    '|---|---|---|---|---|',
    `| AddMany rate ≥ 1.5× \`addBulk\` | ${list('AddMany/addBulk', 'rr', near(1.5))} | | ` +
      `${met(of('AddMany/addBulk').map((r) => r.rr), (v) => v >= 1.5)} | |`,
    `| AddMany Redis CPU ≤ 0.5× \`addBulk\` | ${list('AddMany/addBulk', 'cr', near(0.5))} | ` +
      `\`floor_counters\` ${list('floor_counters/addBulk', 'cr', near(0.5))}; with our library resident ` +
      `${resident.map(near(0.5)).join(', ')}; behind the AddMany service floor ${served.map(near(0.5)).join(', ')} | ` +
      `${met(ours, (v) => v <= 0.5)} | ` +
      `alone ${met(of('floor_counters/addBulk').map((r) => r.cr), (v) => v <= 0.5)}; with our library ` +
      `${met(resident, (v) => v <= 0.5)}; behind the service floor ${met(served, (v) => v <= 0.5)} |`,
    `| unary Add rate ≥ 1.0× \`add\` | ${list('Add/add', 'rr', near(1))} | the service floor ` +
      `${list('service_floor/add', 'rr', near(1))} | ` +
      `${met(of('Add/add').map((r) => r.rr), (v) => v >= 1)} | ` +
      `${met(of('service_floor/add').map((r) => r.rr), (v) => v >= 1)} |`,
    `| unary Add Redis CPU ≤ 0.6× \`add\` | ${list('Add/add', 'cr', near(0.6))} | \`floor_batch\`, one add a ` +
      `call ${list('floor_batch×1/add', 'cr', near(0.6))}; four ${list('floor_batch×4/add', 'cr', near(0.6))}` +
      (of('floor_batch×13/add').length ? `; thirteen ${list('floor_batch×13/add', 'cr', near(0.6))}` : '') +
      (of('floor_batch×13/8/add').length ? `; thirteen over a lane's eight shards, a section each shard, as ` +
        `batcher's round writers send them, ${list('floor_batch×13/8/add', 'cr', near(0.6))}` : '') + ' | ' +
      `${met(of('Add/add').map((r) => r.cr), (v) => v <= 0.6)} | one a call ` +
      `${met(of('floor_batch×1/add').map((r) => r.cr), (v) => v <= 0.6)}` +
      (of('floor_batch×13/8/add').length ? `; batcher's call shape ` +
        `${met(of('floor_batch×13/8/add').map((r) => r.cr), (v) => v <= 0.6)}` : '') + ' |',
    `| service CPU ≤ 20 µs per unary add | ${service.map((s) => us(s[1])).join(', ')} | ` +
      `the service floor ${service.map((s) => us(s[2])).join(', ')} | ` +
      `${met(service.map((s) => s[1]), (v) => v <= 20)} | ${met(service.map((s) => s[2]), (v) => v <= 20)} |`,
  ];
  if (instr) {
    const rules = ratio('every_rule', 'addmany'), floorRules = ratio('floor_rules', 'floor_dedup');
    out.push(`| every rule ≤ 1.25× plain, in instructions | ${x(rules)} | \`floor_rules / floor_dedup\` ` +
      `${x(floorRules)} | ${rules <= 1.25 ? 'met' : 'not met'} | ${floorRules <= 1.25 ? 'met' : 'not met'} |`);
    out.push(...after);
    out.push('', `Redis instructions per item (\`batcher-bench instructions --peer\`, callgrind, Redis ${instr.redis}), ` +
      'counted right after the sitting; the baseline `.ci/run` guards is `bench/instructions.toml`:', '',
    '| shape | per item | beside |', '|---|---|---|');
    const line = (name, what, against) => {
      if (!per(name)) return;
      const beside = against.filter(([b]) => per(b)).map(([b, label]) => `${x(ratio(name, b))} ${label}`);
      out.push(`| \`${name}\`: ${what} | ${per(name).toLocaleString('en')} | ${beside.join('; ')} |`);
    };
    const bulk = ['bullmq_addbulk', '`addBulk`'], add = ['bullmq_add', '`add`'];
    line('addmany', 'AddMany, calls of 100 of one shard', [bulk, ['floor_counters', '`floor_counters`']]);
    line('sharded', 'AddMany as scenario 1 shards it', [bulk]);
    line('unary', 'one item a call', [add, ['floor_batch_unary', '`floor_batch_unary`']]);
    line('rounds', 'unary adds as the round writers send them', [add, ['floor_rounds', '`floor_rounds`']]);
    line('every_rule', 'AddMany with every rule on', [['addmany', '`addmany`'], ['floor_rules', '`floor_rules`']]);
    line('floor_counters', 'the frozen floor of format 4', [bulk]);
    line('floor_batch_unary', 'the frozen floor, one item a call', [add]);
    line('floor_rounds', 'the frozen floor, sent as `rounds`', [add, ['floor_batch_unary', '`floor_batch_unary`']]);
    line('floor_rules', 'the frozen floor with every rule', [['floor_dedup', '`floor_dedup`']]);
    line('bullmq_addbulk', 'BullMQ, `addBulk` of 100', []);
    line('bullmq_add', 'BullMQ, `add`', []);
  }
  if (!instr) out.push(...after);
  out.push('', 'The medians over the pairs (every pair is in the table `bench/peer/run --out` writes):', '',
    ...medians);
  return out;
}
