'use strict';
// What the tests share: a client of the service under test, fresh key names,
// and waiting for the next batch of a subscription with a deadline.

const { Batcher } = require('..');

/** The service under test: $BATCHER_ADDR (tests/it/node.rs sets it, and $BATCHER_TOKEN). */
const ADDRESS = process.env.BATCHER_ADDR;
if (!ADDRESS) throw new Error('set BATCHER_ADDR to the address of a batcher service (see docs/node.md)');

/** Long enough for a loaded machine, short enough to fail fast. */
const DEADLINE_MS = 15_000;

/** A client of the service under test; the caller closes it. */
function connect(options = {}) {
  return new Batcher(ADDRESS, options);
}

const run = `${process.pid}-${Date.now().toString(36)}`;
let keys = 0;
/** A key no other test, nor an earlier run against the same service, uses. */
function freshKey(name) {
  keys += 1;
  return `${name}-${run}-${keys}`;
}

/**
 * The next batch of `iterator`; rejects when none comes within DEADLINE_MS or
 * the stream ends. Close the subscription in t.after(): a test that fails here
 * leaves a next() waiting, and only close() ends it.
 */
async function next(iterator, what = 'next batch') {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within ${DEADLINE_MS} ms`)), DEADLINE_MS);
  });
  const pending = iterator.next();
  pending.catch(() => {}); // if the timeout wins, the test's close() ends this one
  try {
    const { value, done } = await Promise.race([pending, timeout]);
    if (done) throw new Error(`the subscription ended while waiting for ${what}`);
    return value;
  } finally {
    clearTimeout(timer);
  }
}

/** Adds `id` to `key` and closes the group: one batch; resolves to it. */
async function closedBatch(client, key, id) {
  const result = await client.add(key, { id }, { closeGroup: true });
  if (!result.flushed) throw new Error(`adding ${id} with closeGroup flushed nothing`);
  return result.flushed;
}

module.exports = { ADDRESS, DEADLINE_MS, connect, freshKey, next, closedBatch };
