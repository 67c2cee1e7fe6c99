#!/usr/bin/env python3
"""Adds parcels under one key with AddMany, --batch-size at a time.

A call that fails with UNAVAILABLE or DEADLINE_EXCEEDED may have added some
parcels, or all of them. It is repeated with backoff and with the same parcel
ids, which is safe: the service adds each (key, id) once and answers DUPLICATE
for the rest. Parcel ids are <prefix><n>, n from 0 to --count - 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

import grpc

from client import RETRYABLE, Backoff, add_connection_args, connect, metadata, pb, pb_grpc

log = logging.getLogger("producer")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_connection_args(parser)
    parser.add_argument("--key", required=True, help="the key to add under, such as an area")
    parser.add_argument("--count", type=int, required=True, help="how many parcels to add")
    parser.add_argument(
        "--prefix", default="parcel-", help="parcel id prefix (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=100, help="parcels per AddMany (default: %(default)s)"
    )
    parser.add_argument("--close", action="store_true", help="close the group with the last parcel")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per call (default: %(default)s)"
    )
    parser.add_argument(
        "--retry-for",
        type=float,
        default=60.0,
        help="seconds to keep retrying one call (default: %(default)s)",
    )
    return parser.parse_args()


def parcels(args: argparse.Namespace) -> list[pb.AddRequest]:
    """One AddRequest per parcel, with a small JSON payload."""
    requests = []
    for n in range(args.count):
        parcel_id = f"{args.prefix}{n:05d}"
        item = pb.Item(id=parcel_id, payload=f'{{"parcel":"{parcel_id}"}}'.encode())
        requests.append(pb.AddRequest(key=args.key, item=item))
    if args.close and requests:
        requests[-1].close_group = True
    return requests


def add_many(
    stub: pb_grpc.BatcherStub, chunk: list[pb.AddRequest], args: argparse.Namespace
) -> pb.AddManyResponse:
    """Sends chunk until the service answers, repeating it unchanged after a retryable error."""
    backoff = Backoff()
    give_up_at = time.monotonic() + args.retry_for
    request = pb.AddManyRequest(items=chunk)
    while True:
        try:
            return stub.AddMany(request, timeout=args.timeout, metadata=metadata(args.token))
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE or time.monotonic() > give_up_at:
                raise
            delay = backoff.delay()
            log.warning(
                "AddMany of %s..%s failed (%s: %s); retrying in %.2fs with the same ids",
                chunk[0].item.id,
                chunk[-1].item.id,
                err.code().name,
                err.details(),
                delay,
            )
            time.sleep(delay)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args()
    requests = parcels(args)
    outcomes: Counter[str] = Counter()
    with connect(args.addr) as channel:
        stub = pb_grpc.BatcherStub(channel)
        for start in range(0, len(requests), args.batch_size):
            chunk = requests[start : start + args.batch_size]
            try:
                response = add_many(stub, chunk, args)
            except grpc.RpcError as err:
                log.error("AddMany failed: %s: %s", err.code().name, err.details())
                return 1
            for result in response.results:
                outcomes[pb.AddOutcome.Name(result.outcome).removeprefix("ADD_OUTCOME_")] += 1
                for batch in result.batches:
                    log.info(
                        "flushed batch %s of %d parcels (%s)",
                        batch.id,
                        len(batch.items),
                        pb.FlushReason.Name(batch.reason).removeprefix("FLUSH_REASON_"),
                    )
    print(f"added {outcomes['ADDED']}, duplicates {outcomes['DUPLICATE']}, key {args.key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
