'use strict';
// The live subscriber: an async iterator of batches that tracks its cursor,
// and a new subscription from that cursor that misses no batch and repeats none.

const test = require('node:test');
const assert = require('node:assert/strict');
const { status } = require('..');
const { connect, freshKey, next, closedBatch } = require('./support');

test('a live subscription yields each batch flushed after it started, with its cursor', async (t) => {
  const client = connect();
  const key = freshKey('live');
  const sub = client.subscribe({ keys: [key] });
  t.after(() => {
    sub.close();
    client.close();
  });
  await sub.ready;

  const flushed = await closedBatch(client, key, 'p1');
  const seen = [];
  for await (const batch of sub) {
    seen.push(batch);
    break; // ends the loop and closes the subscription
  }
  assert.equal(seen[0].id, flushed.id);
  assert.deepEqual(seen[0].items.map((i) => i.id), ['p1']);
  assert.equal(seen[0].reason, 'CLOSED');
  assert.equal(seen[0].deliveryCount, 0, 'live batches carry no delivery count');
  assert.ok(seen[0].cursor, 'a live batch carries a cursor');
  assert.equal(sub.cursor, seen[0].cursor);
});

test('resuming from the cursor of the last batch received misses none and repeats none', async (t) => {
  const client = connect();
  const key = freshKey('resume');
  t.after(() => client.close());

  const first = client.subscribe({ keys: [key] });
  t.after(() => first.close());
  await first.ready;
  const ids = [];
  for (let n = 1; n <= 3; n++) ids.push((await closedBatch(client, key, `p${n}`)).id);
  const before = first[Symbol.asyncIterator]();
  assert.equal((await next(before)).id, ids[0]);
  assert.equal((await next(before)).id, ids[1]);
  await before.return(); // closes the subscription: the third batch was not received
  const cursor = first.cursor;

  // Flushed while nobody subscribes.
  for (let n = 4; n <= 5; n++) ids.push((await closedBatch(client, key, `p${n}`)).id);

  const resumed = client.subscribe({ keys: [key], after: cursor });
  t.after(() => resumed.close());
  const after = resumed[Symbol.asyncIterator]();
  const got = [];
  for (let n = 0; n < 3; n++) got.push((await next(after)).id);
  assert.deepEqual(got, ids.slice(2, 5), 'the batches after the cursor, in order, once');
  // And then the next one flushed: nothing else came between.
  ids.push((await closedBatch(client, key, 'p6')).id);
  assert.equal((await next(after)).id, ids[5]);
});

test('a cursor the service never gave is INVALID_ARGUMENT naming "after"', async (t) => {
  const client = connect();
  t.after(() => client.close());
  const sub = client.subscribe({ keys: [freshKey('bad-cursor')], after: 'not-a-cursor' });
  t.after(() => sub.close());
  await assert.rejects(next(sub[Symbol.asyncIterator]()), (err) => {
    assert.equal(err.code, status.INVALID_ARGUMENT, err.message);
    assert.match(err.details, /^after: /);
    return true;
  });
  await assert.rejects(sub.ready);
});
