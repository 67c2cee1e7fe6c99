#!/usr/bin/env python3
"""Receives batches through a durable consumer group, and acks each after processing it.

Each batch goes to one consumer of the group and comes back until it is acked,
so nothing is lost while this consumer is down. On a stream error it
reconnects with backoff under the same consumer name, and first gets back the
batches it held unacked (delivery count 2 or more): processing must tolerate
seeing a batch twice.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import grpc
from google.protobuf import json_format

from client import RETRYABLE, Backoff, add_connection_args, connect, metadata, pb, pb_grpc

log = logging.getLogger("consumer")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_connection_args(parser)
    parser.add_argument("--group", required=True, help="the consumer group, created on first use")
    parser.add_argument("--consumer", required=True, help="this consumer's name within the group")
    parser.add_argument("--key", action="append", default=[], help="a key to receive (repeatable)")
    parser.add_argument(
        "--key-prefix", action="append", default=[], help="a key prefix to receive (repeatable)"
    )
    parser.add_argument(
        "--from-start",
        action="store_true",
        help="a new group starts at the oldest retained batch, not at the next one",
    )
    parser.add_argument("--max-items", type=int, help="stop after processing this many items")
    parser.add_argument("--max-batches", type=int, help="stop after processing this many batches")
    parser.add_argument("--json", action="store_true", help="print each batch as one line of JSON")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per Ack (default: %(default)s)"
    )
    return parser.parse_args()


def process(batch: pb.Batch, as_json: bool) -> None:
    """The work done for each batch; here, one line on stdout."""
    if as_json:
        line = json_format.MessageToJson(batch, indent=None)
    else:
        reason = pb.FlushReason.Name(batch.reason).removeprefix("FLUSH_REASON_")
        ids = " ".join(item.id for item in batch.items)
        line = (
            f"{batch.flushed_at.ToJsonString()} {batch.key} batch {batch.id} {reason}"
            f" delivery {batch.delivery_count}: {ids}"
        )
    print(line, flush=True)


class Consumer:
    """Counts what it processed, to stop at --max-items or --max-batches."""

    def __init__(self, stub: pb_grpc.BatcherStub, args: argparse.Namespace) -> None:
        self.stub = stub
        self.args = args
        self.items = 0
        self.batches = 0

    def done(self) -> bool:
        args = self.args
        return (args.max_items is not None and self.items >= args.max_items) or (
            args.max_batches is not None and self.batches >= args.max_batches
        )

    def run(self) -> None:
        """Subscribes, and resubscribes after a retryable error, until done."""
        backoff = Backoff()
        request = pb.SubscribeRequest(
            consumer_group=self.args.group,
            consumer=self.args.consumer,
            keys=self.args.key,
            key_prefixes=self.args.key_prefix,
            after="0" if self.args.from_start else "",
        )
        while not self.done():
            try:
                self.receive(request, backoff)
                if self.done():
                    return
                log.warning("the stream ended (the service is stopping?)")
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE:
                    raise
                log.warning("the stream failed (%s: %s)", err.code().name, err.details())
            delay = backoff.delay()
            log.info("reconnecting through group %s in %.2fs", self.args.group, delay)
            time.sleep(delay)

    def receive(self, request: pb.SubscribeRequest, backoff: Backoff) -> None:
        """Processes and acks batches from one stream until it ends or we are done."""
        md = metadata(self.args.token)
        stream = self.stub.Subscribe(request, metadata=md)
        try:
            for batch in stream:
                backoff.reset()
                process(batch, self.args.json)
                # Ack only after processing: if we die in between, the batch comes back.
                ack = pb.AckRequest(consumer_group=self.args.group, batch_ids=[batch.id])
                self.stub.Ack(ack, timeout=self.args.timeout, metadata=md)
                self.items += len(batch.items)
                self.batches += 1
                if self.done():
                    return
        finally:
            stream.cancel()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args()
    with connect(args.addr) as channel:
        consumer = Consumer(pb_grpc.BatcherStub(channel), args)
        try:
            consumer.run()
        except grpc.RpcError as err:
            log.error("giving up: %s: %s", err.code().name, err.details())
            return 1
        except KeyboardInterrupt:
            return 130
    log.info("processed %d items in %d batches", consumer.items, consumer.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
