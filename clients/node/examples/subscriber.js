#!/usr/bin/env node
'use strict';
// Prints every batch of --key as it is flushed: a live subscription. After
// each batch it writes the batch's cursor to --cursor-file, and it starts
// from the cursor in that file: run it again after a stop and it prints the
// batches flushed meanwhile, none twice. Without a cursor it starts now, or
// at the oldest retained batch with --from-start. --max-batches N stops it
// after N batches. When its stream ends UNAVAILABLE (the instance drains
// or restarts) it subscribes again after the last batch it received.
//
//   BATCHER_ADDR=127.0.0.1:50051 node examples/subscriber.js --key north --cursor-file north.cursor

const fs = require('node:fs');
const { parseArgs } = require('node:util');
const { setTimeout: sleep } = require('node:timers/promises');
const { Batcher, status } = require('..');

const { values: opt } = parseArgs({
  options: {
    key: { type: 'string', default: 'north' },
    'cursor-file': { type: 'string', default: 'subscriber.cursor' },
    'from-start': { type: 'boolean', default: false },
    'max-batches': { type: 'string' },
  },
});

function savedCursor() {
  try {
    return fs.readFileSync(opt['cursor-file'], 'utf8').trim();
  } catch {
    return '';
  }
}

async function main() {
  const client = new Batcher(); // $BATCHER_ADDR, $BATCHER_TOKEN
  let after = savedCursor() || (opt['from-start'] ? '0' : '');
  let left = opt['max-batches'] === undefined ? Infinity : Number(opt['max-batches']);
  try {
    while (left > 0) {
      const subscription = client.subscribe({ keys: [opt.key], after });
      try {
        await subscription.ready;
        console.error(`subscribed to ${opt.key} ${after ? `after ${after}` : 'from now'}`);
        for await (const batch of subscription) {
          const ids = batch.items.map((item) => item.id).join(' ');
          console.log(`${batch.flushedAt.toISOString()} ${batch.key} ${batch.reason} ${batch.id}: ${ids}`);
          fs.writeFileSync(opt['cursor-file'], batch.cursor);
          if (--left <= 0) break;
        }
      } catch (err) {
        // An instance that drains (or restarts) ends the stream UNAVAILABLE:
        // subscribe again, on whichever instance answers, after the last batch.
        if (err.code !== status.UNAVAILABLE) throw err;
        console.error(`subscriber: ${err.details}; resubscribing`);
        await sleep(1000);
      }
      after = subscription.cursor;
    }
  } finally {
    client.close();
  }
}

main().catch((err) => {
  console.error(`subscriber: ${err.message}`);
  process.exit(1);
});
