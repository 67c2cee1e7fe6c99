"""What producer.py and consumer.py share: the generated stubs, the command-line
options for reaching the service, auth metadata, and retry backoff."""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

import grpc

# The stubs that generate.py writes. Appended, so a PYTHONPATH that holds
# stubs generated elsewhere wins.
sys.path.append(str(Path(__file__).resolve().parent / "gen"))

from batcher.v1 import batcher_pb2 as pb  # noqa: E402
from batcher.v1 import batcher_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["RETRYABLE", "Backoff", "add_connection_args", "connect", "metadata", "pb", "pb_grpc"]

# Codes after which the same call may be repeated: the service (or its Redis)
# is unreachable for now, or the answer did not come in time. Adds are
# idempotent per (key, item id) and acks per batch id, so a repeat is safe.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """Adds --addr and --token, defaulting to $BATCHER_ADDR and $BATCHER_TOKEN."""
    parser.add_argument(
        "--addr",
        default=os.environ.get("BATCHER_ADDR", "127.0.0.1:50051"),
        help="the service's gRPC address, host:port (default: $BATCHER_ADDR or %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("BATCHER_TOKEN"),
        help="a bearer token, when the service has [auth] (default: $BATCHER_TOKEN)",
    )


def connect(addr: str) -> grpc.Channel:
    """A plaintext channel to addr; it connects lazily and reconnects by itself.

    gRPC's own reconnect backoff grows to 2 minutes by default, and calls fail
    at once while it waits; capped at 5 s, like Backoff, a restarted service
    is found again within seconds.
    """
    options = [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 5000),
    ]
    return grpc.insecure_channel(addr, options=options)


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries token, if any."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class Backoff:
    """Exponential backoff with jitter: waits grow from first to cap seconds."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def reset(self) -> None:
        """Starts again from the shortest wait, after a success."""
        self._next = self._first

    def delay(self) -> float:
        """The next wait, in seconds: half of it fixed and half random."""
        delay = self._next / 2 + random.uniform(0, self._next / 2)
        self._next = min(self._next * 2, self._cap)
        return delay
