// Types for index.js, written by hand: there is no build step.

import * as grpc from '@grpc/grpc-js';

/** Why a group was flushed (docs/api.md, "Flush reasons"). */
export type FlushReason =
  | 'SIZE'
  | 'TIMEOUT'
  | 'BYTES'
  | 'MANUAL'
  | 'CAPACITY'
  | 'IDLE'
  | 'CUTOFF'
  | 'DEADLINE'
  | 'MAX_AGE'
  | 'CLOSED';

/** A time: a Date, milliseconds since the epoch, or an ISO 8601 string. */
export type Time = Date | number | string;

/** An item to add. */
export interface ItemInput {
  /** 1 to 256 bytes of UTF-8, unique within its key. */
  id: string;
  /** Opaque bytes; a string is sent as its UTF-8 bytes. */
  payload?: Buffer | Uint8Array | string;
  /** Named amounts, such as { weight_g: 1200 }, at most 2^53 - 1 each. */
  measures?: Record<string, number>;
  /** The latest time this item's batch may be flushed. */
  deadline?: Time;
}

/** An item of a batch. */
export interface Item {
  id: string;
  payload: Buffer;
  measures: Record<string, number>;
  /** Its deadline, to the millisecond, or null. */
  deadline: Date | null;
  /** How many times Requeue has put it back. */
  requeueCount: number;
}

/** A flushed group. */
export interface Batch {
  /** Unique, and the same on every redelivery. */
  id: string;
  key: string;
  /** In arrival order. */
  items: Item[];
  reason: FlushReason;
  /** Redis's clock, to the millisecond. */
  openedAt: Date;
  flushedAt: Date;
  /** On a live subscription: pass it as `after` to resume right after this batch. '' elsewhere. */
  cursor: string;
  /** On a durable subscription: 1 on the first delivery, more on redeliveries. 0 elsewhere. */
  deliveryCount: number;
}

/** What one add did. */
export interface AddResult {
  outcome: 'ADDED' | 'DUPLICATE';
  /** The open group's size after the add: 0 if it flushed the group. */
  groupSize: number;
  /** The last batch the add wrote, or null. */
  flushed: Batch | null;
  /** Every batch the add wrote, oldest first. */
  batches: Batch[];
}

/** One add of an AddMany. */
export interface AddInput {
  key: string;
  item: ItemInput;
  /** Flush the group with this item (reason CLOSED). */
  closeGroup?: boolean;
}

export interface ClientOptions {
  /** A bearer token for a service with [auth]; default $BATCHER_TOKEN. */
  token?: string;
  /** Default: insecure (plaintext). grpc.credentials.createSsl(...) for TLS. */
  credentials?: grpc.ChannelCredentials;
  /** The deadline of each unary call, in milliseconds; default 30000. */
  timeoutMs?: number;
  /** grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
}

export interface CallOptions {
  /** This call's deadline, in milliseconds from now. */
  timeoutMs?: number;
}

export interface SubscribeOptions {
  /** Exact keys; with keyPrefixes also empty, every key. */
  keys?: string[];
  keyPrefixes?: string[];
  /** '' (now, the default), '0' (the oldest retained batch) or a Batch.cursor (live only). */
  after?: string;
}

export interface ConsumeOptions extends SubscribeOptions {
  /** The consumer group, created on first use (1 to 64 of A-Z a-z 0-9 _ - .). */
  group: string;
  /** This consumer's name in the group; reconnecting under it first returns what it held unacked. */
  consumer: string;
}

/** A Subscribe stream: iterate it once with `for await`; ending the loop closes it. */
export class Subscription implements AsyncIterable<Batch> {
  /** The cursor of the last batch received, or the `after` it started from. */
  cursor: string;
  /** Resolves once the service has started the subscription. */
  readonly ready: Promise<void>;
  [Symbol.asyncIterator](): AsyncIterator<Batch>;
  close(): void;
}

/** A durable consumer of a consumer group. */
export class Consumer extends Subscription {
  readonly group: string;
  /** Acks batches or batch ids for this group; resolves to how many were pending. */
  ack(batches: Batch | string | Array<Batch | string>, options?: CallOptions): Promise<number>;
}

export class Batcher {
  /** @param address host:port (or http://host:port, https://host:port); default $BATCHER_ADDR or 127.0.0.1:50051 */
  constructor(address?: string, options?: ClientOptions);
  readonly address: string;
  /** The grpc-js client, for the calls this class does not wrap (fields in camelCase). */
  readonly raw: grpc.Client & Record<string, Function>;
  add(key: string, item: ItemInput, options?: CallOptions & { closeGroup?: boolean }): Promise<AddResult>;
  addMany(adds: AddInput[], options?: CallOptions): Promise<AddResult[]>;
  flush(key: string, options?: CallOptions): Promise<Batch[]>;
  subscribe(options?: SubscribeOptions): Subscription;
  consume(options: ConsumeOptions): Consumer;
  ack(group: string, batches: Batch | string | Array<Batch | string>, options?: CallOptions): Promise<number>;
  metadata(): grpc.Metadata;
  close(): void;
}

/** gRPC status codes, to compare with a failed call's `err.code`. */
export const status: typeof grpc.status;
export { grpc };
