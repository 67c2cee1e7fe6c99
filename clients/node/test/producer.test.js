'use strict';
// The producer's calls: add and addMany against the service, with the batches
// their replies carry, per-item deadlines, and INVALID_ARGUMENT for bad input.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Batcher, status } = require('..');
const { ADDRESS, connect, freshKey, next } = require('./support');

test('add answers ADDED, then DUPLICATE for the same id, and closeGroup returns the batch', async (t) => {
  const client = connect();
  t.after(() => client.close());
  const key = freshKey('add');

  const first = await client.add(key, { id: 'p1', payload: '{"w":42}', measures: { weight_g: 1200 } });
  assert.deepEqual(first, { outcome: 'ADDED', groupSize: 1, flushed: null, batches: [] });
  const again = await client.add(key, { id: 'p1' });
  assert.equal(again.outcome, 'DUPLICATE');
  assert.equal(again.groupSize, 1);

  const closed = await client.add(key, { id: 'p2', payload: Buffer.from([0, 255]) }, { closeGroup: true });
  assert.equal(closed.outcome, 'ADDED');
  assert.equal(closed.groupSize, 0);
  assert.equal(closed.batches.length, 1);
  const batch = closed.flushed;
  assert.deepEqual(closed.batches[0], batch);
  assert.equal(batch.key, key);
  assert.equal(batch.reason, 'CLOSED');
  assert.deepEqual(batch.items.map((i) => i.id), ['p1', 'p2']);
  assert.equal(batch.items[0].payload.toString(), '{"w":42}');
  assert.deepEqual(batch.items[0].measures, { weight_g: 1200 });
  assert.deepEqual([...batch.items[1].payload], [0, 255]);
  assert.ok(batch.openedAt instanceof Date && batch.flushedAt >= batch.openedAt, 'timestamps are Dates');
});

test('addMany answers in request order, with the batch that the third item completed', async (t) => {
  const client = connect();
  t.after(() => client.close());
  const key = freshKey('many'); // max_items = 3 (tests/it/node.rs)
  const other = freshKey('many-other');

  const results = await client.addMany([
    { key, item: { id: 'a' } },
    { key: other, item: { id: 'x' } },
    { key, item: { id: 'b' } },
    { key, item: { id: 'c' } },
    { key, item: { id: 'd' } },
    { key, item: { id: 'a' } },
  ]);
  assert.deepEqual(
    results.map((r) => [r.outcome, r.groupSize]),
    [['ADDED', 1], ['ADDED', 1], ['ADDED', 2], ['ADDED', 0], ['ADDED', 1], ['DUPLICATE', 1]],
    'the last "a" was flushed within the dedup window: a duplicate',
  );
  const full = results[3].flushed;
  assert.equal(full.reason, 'SIZE');
  assert.deepEqual(full.items.map((i) => i.id), ['a', 'b', 'c']);
  assert.deepEqual(
    results.map((r) => r.batches.length),
    [0, 0, 0, 1, 0, 0],
    'only the third item of key flushed a batch',
  );
});

test('addMany with per-item deadlines: a group flushes at its earliest deadline, reason DEADLINE', async (t) => {
  const client = connect();
  const key = freshKey('deadline');
  const relaxed = freshKey('deadline-relaxed');
  const live = client.subscribe({ keys: [key] });
  t.after(() => {
    live.close();
    client.close();
  });
  await live.ready;

  const soon = new Date(Date.now() + 700);
  const later = new Date(Date.now() + 3_600_000);
  const results = await client.addMany([
    { key, item: { id: 'standard' } },
    { key, item: { id: 'express', deadline: soon } },
    { key: relaxed, item: { id: 'next-day', deadline: later.toISOString() } },
  ]);
  assert.deepEqual(results.map((r) => [r.outcome, r.groupSize]), [['ADDED', 1], ['ADDED', 2], ['ADDED', 1]]);

  const batch = await next(live[Symbol.asyncIterator](), 'the DEADLINE batch');
  assert.equal(batch.key, key);
  assert.equal(batch.reason, 'DEADLINE');
  assert.deepEqual(
    batch.items.map((i) => [i.id, i.deadline?.getTime() ?? null]),
    [['standard', null], ['express', soon.getTime()]],
  );
  assert.ok(batch.flushedAt >= soon, `flushed at ${batch.flushedAt.toISOString()}, before ${soon.toISOString()}`);

  // The far deadline has not flushed its group; Flush shows it kept the deadline.
  const [manual, ...more] = await client.flush(relaxed);
  assert.equal(more.length, 0);
  assert.equal(manual.reason, 'MANUAL');
  assert.equal(manual.items[0].deadline.getTime(), later.getTime());
});

test('addMany with a bad item fails whole with INVALID_ARGUMENT naming the field, and adds nothing', async (t) => {
  const client = connect();
  t.after(() => client.close());
  const key = freshKey('invalid');

  await assert.rejects(
    client.addMany([
      { key, item: { id: 'good' } },
      { key, item: { id: '' } },
    ]),
    (err) => {
      assert.equal(err.code, status.INVALID_ARGUMENT, err.message);
      assert.match(err.details, /^items\[1\]\.item\.id: /);
      return true;
    },
  );
  const retry = await client.add(key, { id: 'good' });
  assert.deepEqual([retry.outcome, retry.groupSize], ['ADDED', 1], 'the failed call added nothing');
});

test('a call without the token is refused with UNAUTHENTICATED', { skip: !process.env.BATCHER_TOKEN }, async (t) => {
  const client = connect({ token: '' });
  t.after(() => client.close());
  await assert.rejects(client.add(freshKey('auth'), { id: 'p1' }), (err) => {
    assert.equal(err.code, status.UNAUTHENTICATED, err.message);
    return true;
  });
});

test('the address may have the CLI form, http://host:port', async (t) => {
  const client = new Batcher(`http://${ADDRESS}`);
  t.after(() => client.close());
  const result = await client.add(freshKey('url'), { id: 'p1' });
  assert.equal(result.outcome, 'ADDED');
});
