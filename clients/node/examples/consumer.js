#!/usr/bin/env node
'use strict';
// Reads the batches of --key through the durable consumer group --group as
// --consumer, prints each and acks it after processing it. A batch it does
// not ack (it crashed, say) is delivered again: to it when it comes back
// under the same name, or to another consumer of the group after the
// service's ack_timeout. The group starts now when it is created, or at the
// oldest retained batch with --from-start. --max-batches N stops it after N.
// When its stream ends UNAVAILABLE (the instance drains or restarts) it
// consumes again under the same name, and gets back first what it held
// (what no other consumer of the group has taken over meanwhile).
//
//   BATCHER_ADDR=127.0.0.1:50051 node examples/consumer.js --group loaders --consumer truck-1 --key north

const { parseArgs } = require('node:util');
const { setTimeout: sleep } = require('node:timers/promises');
const { Batcher, status } = require('..');

const { values: opt } = parseArgs({
  options: {
    key: { type: 'string', default: 'north' },
    group: { type: 'string', default: 'loaders' },
    consumer: { type: 'string', default: 'truck-1' },
    'from-start': { type: 'boolean', default: false },
    'max-batches': { type: 'string' },
  },
});

async function main() {
  const client = new Batcher(); // $BATCHER_ADDR, $BATCHER_TOKEN
  let left = opt['max-batches'] === undefined ? Infinity : Number(opt['max-batches']);
  try {
    while (left > 0) {
      const consumer = client.consume({
        group: opt.group,
        consumer: opt.consumer,
        keys: [opt.key],
        after: opt['from-start'] ? '0' : '',
      });
      try {
        await consumer.ready;
        console.error(`consuming ${opt.key} in group ${opt.group} as ${opt.consumer}`);
        for await (const batch of consumer) {
          const ids = batch.items.map((item) => item.id).join(' ');
          console.log(`${batch.key} ${batch.reason} ${batch.id} delivery ${batch.deliveryCount}: ${ids}`);
          await consumer.ack(batch); // after processing: a crash before this means a redelivery
          if (--left <= 0) break;
        }
      } catch (err) {
        // An instance that drains (or restarts) ends the stream UNAVAILABLE:
        // consume again under the same name, on whichever instance answers.
        if (err.code !== status.UNAVAILABLE) throw err;
        console.error(`consumer: ${err.details}; consuming again`);
        await sleep(1000);
      }
    }
  } finally {
    client.close();
  }
}

main().catch((err) => {
  console.error(`consumer: ${err.message}`);
  process.exit(1);
});
