'use strict';
// A Node client for batcher (proto/batcher/v1/batcher.proto), on @grpc/grpc-js
// with @grpc/proto-loader: the proto is loaded from this checkout at run time,
// so there is no generated code and no build step.
//
// - Batcher: add and addMany (producers), subscribe (a live subscription, an
//   async iterator that tracks its resume cursor), consume (a durable consumer
//   of a consumer group, with ack), and `raw` for the other calls.
// - Batches and items come back as plain objects: camelCase fields,
//   timestamps as Date, payloads as Buffer, measures as numbers, and reasons
//   and outcomes as their short names ('SIZE', 'ADDED').
// - Failed calls reject with grpc-js's ServiceError: compare `err.code` with
//   `status` (exported here); for INVALID_ARGUMENT, `err.details` starts with
//   the field, such as `items[3].item.id: must not be empty`.

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/** Where the .proto files live: the repository's proto/ directory. */
const PROTO_DIR = path.resolve(__dirname, '..', '..', 'proto');

const definition = protoLoader.loadSync('batcher/v1/batcher.proto', {
  includeDirs: [PROTO_DIR],
  keepCase: false, // camelCase fields, in requests and replies alike
  longs: Number, // measures are at most 2^53 - 1, so a Number holds them exactly
  enums: String,
  defaults: true,
});
const BatcherService = grpc.loadPackageDefinition(definition).batcher.v1.Batcher;

/** The address used when none is given: $BATCHER_ADDR (as the CLI reads it), else the service's default. */
const DEFAULT_ADDRESS = process.env.BATCHER_ADDR || '127.0.0.1:50051';

/** The default deadline of a unary call, in milliseconds. */
const DEFAULT_TIMEOUT_MS = 30_000;

/** A client of one batcher service. Close it with close(). */
class Batcher {
  /**
   * @param {string} [address] host:port; default $BATCHER_ADDR or 127.0.0.1:50051
   * @param {object} [options] token, credentials, timeoutMs, channelOptions
   */
  constructor(address = DEFAULT_ADDRESS, options = {}) {
    // The CLI's form of $BATCHER_ADDR, http://host:port or https://host:port, works too.
    const [, scheme, hostPort] = /^(?:(https?):\/\/)?(.*?)\/?$/.exec(address);
    this.address = hostPort;
    this.token = options.token ?? process.env.BATCHER_TOKEN ?? undefined;
    this.credentials =
      options.credentials ??
      (scheme === 'https' ? grpc.credentials.createSsl() : grpc.credentials.createInsecure());
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.channelOptions = options.channelOptions ?? {};
    /** The generated grpc-js client, for the calls this class does not wrap. */
    this.raw = new BatcherService(this.address, this.credentials, this.channelOptions);
  }

  /**
   * Adds one item to the open group of `key`.
   * @returns {Promise<AddResult>}
   */
  async add(key, item, { closeGroup = false, timeoutMs } = {}) {
    const request = { key, item: toItem(item), closeGroup };
    return toAddResult(await this.#unary('add', request, timeoutMs));
  }

  /**
   * Adds many items, each `{ key, item, closeGroup? }`, in one call; results
   * come back in the same order. One bad item fails the whole call with
   * INVALID_ARGUMENT and nothing is added. Repeating a failed call with the
   * same item ids is safe: adds are idempotent per (key, item id).
   * @returns {Promise<AddResult[]>}
   */
  async addMany(adds, { timeoutMs } = {}) {
    const items = adds.map((a) => ({ key: a.key, item: toItem(a.item), closeGroup: !!a.closeGroup }));
    const reply = await this.#unary('addMany', { items }, timeoutMs);
    return reply.results.map(toAddResult);
  }

  /**
   * Flushes the open group of `key` now (reason MANUAL); resolves to the
   * batches written, none when the key had no open group.
   * @returns {Promise<Batch[]>}
   */
  async flush(key, { timeoutMs } = {}) {
    const reply = await this.#unary('flush', { key }, timeoutMs);
    return reply.batches.map(toBatch);
  }

  /**
   * A live subscription: batches of `keys` and `keyPrefixes` (both empty:
   * every key) flushed after `after`: '' (now), '0' (the oldest retained
   * batch) or the cursor of the last batch received.
   * @returns {Subscription}
   */
  subscribe({ keys = [], keyPrefixes = [], after = '' } = {}) {
    return new Subscription(this, { keys, keyPrefixes, after });
  }

  /**
   * A durable consumer `consumer` of consumer group `group` (created on
   * first use, starting at `after`: '' now, '0' the oldest retained batch).
   * Each batch stays pending until acked; one not acked within the service's
   * ack_timeout is delivered again.
   * @returns {Consumer}
   */
  consume({ group, consumer, keys = [], keyPrefixes = [], after = '' }) {
    const request = { keys, keyPrefixes, after, consumerGroup: group, consumer };
    return new Consumer(this, group, request);
  }

  /**
   * Acknowledges batches (ids, or batches) for consumer group `group`;
   * resolves to how many of them were pending.
   * @returns {Promise<number>}
   */
  async ack(group, batches, { timeoutMs } = {}) {
    const batchIds = [batches].flat().map((b) => (typeof b === 'string' ? b : b.id));
    const reply = await this.#unary('ack', { consumerGroup: group, batchIds }, timeoutMs);
    return reply.acked;
  }

  /** Closes the connection; open subscriptions are closed by their own close(). */
  close() {
    this.raw.close();
  }

  /** The call metadata: the bearer token, if any. */
  metadata() {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set('authorization', `Bearer ${this.token}`);
    return metadata;
  }

  #unary(method, request, timeoutMs = this.timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    return new Promise((resolve, reject) => {
      this.raw[method](request, this.metadata(), { deadline }, (err, reply) =>
        err ? reject(err) : resolve(reply),
      );
    });
  }
}

/**
 * One Subscribe stream, iterated with `for await`. It runs on a connection of
 * its own, as docs/subscriptions.md advises, and is closed when the loop ends
 * (break, return or throw) or by close().
 */
class Subscription {
  #call;
  #client;
  #iterated = false;

  constructor(batcher, request) {
    /** The cursor of the last batch received (live only); pass it as `after` to resume. */
    this.cursor = request.after;
    // A local subchannel pool gives this stream its own HTTP/2 connection.
    const options = { ...batcher.channelOptions, 'grpc.use_local_subchannel_pool': 1 };
    this.#client = new BatcherService(batcher.address, batcher.credentials, options);
    this.#call = this.#client.subscribe(request, batcher.metadata());
    // Errors reach the iterator; this listener only keeps an error that no
    // loop is waiting for (say, after close()) from crashing the process.
    this.#call.on('error', () => {});
    /**
     * Resolves once the service has started the subscription (its response
     * headers came): from then on, every batch flushed is delivered.
     */
    this.ready = new Promise((resolve, reject) => {
      this.#call.once('metadata', () => resolve());
      this.#call.once('error', reject);
    });
    this.ready.catch(() => {});
  }

  async *[Symbol.asyncIterator]() {
    if (this.#iterated) throw new Error('a subscription can be iterated only once');
    this.#iterated = true;
    try {
      for await (const message of this.#call) {
        const batch = toBatch(message);
        if (batch.cursor) this.cursor = batch.cursor;
        yield batch;
      }
    } finally {
      this.close();
    }
  }

  /** Ends the stream and its connection. */
  close() {
    this.#call.cancel();
    this.#client.close();
  }
}

/** A durable Subscribe stream: a Subscription whose batches are acked. */
class Consumer extends Subscription {
  #batcher;

  constructor(batcher, group, request) {
    super(batcher, request);
    this.#batcher = batcher;
    this.group = group;
  }

  /** Acks batches (or batch ids) for this consumer's group. */
  ack(batches, options) {
    return this.#batcher.ack(this.group, batches, options);
  }
}

/** The proto Item for `item`: a string payload is sent as its UTF-8 bytes. */
function toItem(item) {
  if (item == null || typeof item !== 'object') throw new TypeError('item must be an object with an id');
  const out = { id: item.id, measures: item.measures ?? {} };
  if (item.payload != null) {
    out.payload = typeof item.payload === 'string' ? Buffer.from(item.payload) : item.payload;
  }
  if (item.deadline != null) out.deadline = toTimestamp(item.deadline);
  return out;
}

/** A Timestamp from a Date, milliseconds since the epoch, or an ISO 8601 string. */
function toTimestamp(time) {
  const ms = time instanceof Date ? time.getTime() : typeof time === 'string' ? Date.parse(time) : time;
  if (!Number.isFinite(ms)) throw new TypeError(`not a time: ${time}`);
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

/** A Date from a Timestamp (to the millisecond), or null when unset. */
function fromTimestamp(ts) {
  return ts ? new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6)) : null;
}

/** The short name of a proto enum value: FLUSH_REASON_SIZE is 'SIZE'. */
function shortName(value, prefix) {
  return value.startsWith(prefix) ? value.slice(prefix.length) : value;
}

function fromItem(item) {
  return {
    id: item.id,
    payload: item.payload,
    measures: item.measures,
    deadline: fromTimestamp(item.deadline),
    requeueCount: item.requeueCount,
  };
}

function toBatch(batch) {
  return {
    id: batch.id,
    key: batch.key,
    items: batch.items.map(fromItem),
    reason: shortName(batch.reason, 'FLUSH_REASON_'),
    openedAt: fromTimestamp(batch.openedAt),
    flushedAt: fromTimestamp(batch.flushedAt),
    cursor: batch.cursor,
    deliveryCount: batch.deliveryCount,
  };
}

function toAddResult(result) {
  return {
    outcome: shortName(result.outcome, 'ADD_OUTCOME_'),
    groupSize: result.groupSize,
    flushed: result.flushed ? toBatch(result.flushed) : null,
    batches: result.batches.map(toBatch),
  };
}

module.exports = { Batcher, Subscription, Consumer, status: grpc.status, grpc };
