'use strict';
// The three programs of examples/, as docs/node.md runs them: the producer's
// parcels reach the durable consumer once each, and the subscriber, run
// twice with its cursor file, prints every batch once.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { DEADLINE_MS, freshKey } = require('./support');

/** Runs examples/<name>.js with `args` to its end; resolves to its stdout, rejects with its output unless it exits 0. */
function run(name, args) {
  const script = path.join(__dirname, '..', 'examples', `${name}.js`);
  const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const started = new Promise((resolve) => child.stderr.once('data', resolve));
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => child.kill(), DEADLINE_MS);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(stdout);
      else reject(new Error(`${name} ${args.join(' ')}: exit ${code ?? signal}\n${stdout}${stderr}`));
    });
  });
  return { started, done };
}

/** The parcel ids in the output lines, in order. */
function parcels(output) {
  return output.match(/\b[ab]-\d{5}\b/g) ?? [];
}

const ids = (prefix, count) => Array.from({ length: count }, (_, n) => `${prefix}${String(n).padStart(5, '0')}`);

test('the producer, the consumer and the subscriber, run as docs/node.md shows', async (t) => {
  const key = freshKey('example'); // max_items = 10 for example-* (tests/it/node.rs)
  const group = freshKey('trucks');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'batcher-node-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const cursorFile = path.join(dir, 'subscriber.cursor');

  const consumer = run('consumer', ['--key', key, '--group', group, '--consumer', 'truck-1', '--max-batches', '4']);
  await consumer.started; // it logs once its group exists; from then on, no batch is missed

  const produced = await run('producer', ['--key', key, '--count', '25', '--prefix', 'a-', '--close']).done;
  assert.match(produced, /added 25, duplicates 0/);
  assert.deepEqual(
    produced.match(/\((\w+)\)/g),
    ['(SIZE)', '(SIZE)', '(CLOSED)'],
    produced,
  );
  const repeated = await run('producer', ['--key', key, '--count', '25', '--prefix', 'a-', '--close']).done;
  assert.match(repeated, /added 0, duplicates 25/);

  const firstRun = await run('subscriber', ['--key', key, '--from-start', '--cursor-file', cursorFile, '--max-batches', '2']).done;
  assert.deepEqual(parcels(firstRun), ids('a-', 20));
  const more = await run('producer', ['--key', key, '--count', '3', '--prefix', 'b-', '--close']).done;
  assert.match(more, /added 3, duplicates 0/);
  const secondRun = await run('subscriber', ['--key', key, '--cursor-file', cursorFile, '--max-batches', '2']).done;
  assert.deepEqual(parcels(secondRun), [...ids('a-', 25).slice(20), ...ids('b-', 3)], 'resumed after the cursor');

  const consumed = await consumer.done;
  assert.deepEqual(parcels(consumed), [...ids('a-', 25), ...ids('b-', 3)]);
  assert.equal((consumed.match(/delivery 1:/g) ?? []).length, 4, consumed);
});
