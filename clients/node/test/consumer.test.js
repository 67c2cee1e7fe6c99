'use strict';
// The durable consumer: batches of a consumer group, acked ones gone for
// good, an unacked one delivered again after the ack timeout (2 s in
// tests/it/node.rs) or when its consumer comes back.

const test = require('node:test');
const assert = require('node:assert/strict');
const { connect, freshKey, next, closedBatch } = require('./support');

test('an acked batch is done; an unacked one comes again after the ack timeout, same id', async (t) => {
  const client = connect();
  const key = freshKey('durable');
  const group = freshKey('loaders');
  const consumer = client.consume({ group, consumer: 'truck-1', keys: [key] });
  const batches = consumer[Symbol.asyncIterator]();
  t.after(() => {
    consumer.close();
    client.close();
  });
  await consumer.ready; // the group exists from here on, starting now

  const a = await closedBatch(client, key, 'a');
  const b = await closedBatch(client, key, 'b');
  const first = await next(batches, 'batch a');
  const second = await next(batches, 'batch b');
  assert.deepEqual([first.id, first.deliveryCount], [a.id, 1]);
  assert.deepEqual([second.id, second.deliveryCount], [b.id, 1]);

  assert.equal(await consumer.ack(second), 1, 'b was pending');
  // a is not acked: after the ack timeout it is delivered again.
  const again = await next(batches, 'batch a again');
  assert.deepEqual([again.id, again.deliveryCount], [a.id, 2]);
  assert.deepEqual(again.items.map((i) => i.id), ['a']);
  assert.equal(await client.ack(group, [again.id]), 1, 'a was pending');

  // b, acked, never comes again: the next batch is one flushed now.
  const c = await closedBatch(client, key, 'c');
  const third = await next(batches, 'batch c');
  assert.deepEqual([third.id, third.deliveryCount], [c.id, 1]);
  assert.equal(await consumer.ack(third.id), 1);
  assert.equal(await consumer.ack([a.id, b.id, c.id]), 0, 'nothing is pending any more');
});

test('a consumer that comes back under its name gets the batch it held unacked first', async (t) => {
  const client = connect();
  const key = freshKey('comeback');
  const group = freshKey('sorters');
  t.after(() => client.close());

  const before = client.consume({ group, consumer: 'sorter-1', keys: [key] });
  t.after(() => before.close());
  await before.ready;
  const held = await closedBatch(client, key, 'p1');
  for await (const batch of before) {
    assert.equal(batch.id, held.id);
    break; // gone without an ack
  }
  const waiting = await closedBatch(client, key, 'p2'); // flushed while it is away

  const after = client.consume({ group, consumer: 'sorter-1' });
  t.after(() => after.close());
  const batches = after[Symbol.asyncIterator]();
  const back = await next(batches, 'the held batch');
  assert.equal(back.id, held.id, 'the held batch comes first');
  assert.ok(back.deliveryCount >= 2, `delivery ${back.deliveryCount}`);
  const then = await next(batches, 'the batch flushed while it was away');
  assert.equal(then.id, waiting.id);
  assert.equal(await after.ack([back, then]), 2);
});
