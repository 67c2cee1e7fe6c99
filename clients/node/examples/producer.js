#!/usr/bin/env node
'use strict';
// Adds --count parcels under --key with AddMany, --per-call at a time; every
// --express-every'th parcel is express, with a deadline --express-within
// seconds from now. --close closes the last group. Prints each batch the adds
// flushed, then "added N, duplicates M". Running it again with the same ids
// adds nothing: adds are idempotent per (key, item id).
//
//   BATCHER_ADDR=127.0.0.1:50051 node examples/producer.js --key north --count 25 --close

const { parseArgs } = require('node:util');
const { Batcher } = require('..');

const { values: opt } = parseArgs({
  options: {
    key: { type: 'string', default: 'north' },
    count: { type: 'string', default: '25' },
    prefix: { type: 'string', default: 'parcel-' },
    'per-call': { type: 'string', default: '10' },
    'express-every': { type: 'string', default: '10' },
    'express-within': { type: 'string', default: '1800' },
    close: { type: 'boolean', default: false },
  },
});

async function main() {
  const client = new Batcher(); // $BATCHER_ADDR, $BATCHER_TOKEN
  const count = Number(opt.count);
  const deadline = new Date(Date.now() + Number(opt['express-within']) * 1000);
  const parcels = Array.from({ length: count }, (_, n) => ({
    key: opt.key,
    item: {
      id: `${opt.prefix}${String(n).padStart(5, '0')}`,
      payload: JSON.stringify({ n }),
      deadline: n % Number(opt['express-every']) === 0 ? deadline : undefined,
    },
    closeGroup: opt.close && n === count - 1,
  }));
  let added = 0;
  let duplicates = 0;
  try {
    for (let i = 0; i < parcels.length; i += Number(opt['per-call'])) {
      const results = await client.addMany(parcels.slice(i, i + Number(opt['per-call'])));
      for (const result of results) {
        if (result.outcome === 'ADDED') added++;
        else duplicates++;
        for (const batch of result.batches) {
          console.log(`flushed ${batch.id} of ${batch.key}: ${batch.items.length} parcels (${batch.reason})`);
        }
      }
    }
  } finally {
    client.close();
  }
  console.log(`added ${added}, duplicates ${duplicates}`);
}

main().catch((err) => {
  console.error(`producer: ${err.message}`);
  process.exit(1);
});
