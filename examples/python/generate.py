#!/usr/bin/env python3
"""Generates the Python stubs of batcher.v1 from the repository's proto/ into gen/.

Usage: python generate.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
# Every file of the package: batcher.proto imports policies.proto.
PROTOS = ["batcher/v1/batcher.proto", "batcher/v1/policies.proto"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "gen", help="where to write the stubs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # grpc_tools bundles google/protobuf/*.proto (timestamp, duration, field
    # mask), which the protos import.
    bundled = resources.files("grpc_tools") / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{bundled}",
            f"--python_out={args.out}",
            f"--pyi_out={args.out}",
            f"--grpc_python_out={args.out}",
            *PROTOS,
        ]
    )
    if code != 0:
        print(f"protoc failed with exit code {code}", file=sys.stderr)
        return 1
    print(f"wrote the batcher.v1 stubs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
