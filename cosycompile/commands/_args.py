"""Options several commands share."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_common(p: argparse.ArgumentParser) -> None:
    """--artifacts and --quiet."""
    p.add_argument("--artifacts", type=Path, default=Path("artifacts"), metavar="DIR",
                   help="cache and build output folder (default: ./artifacts)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result")


def add_remote(p: argparse.ArgumentParser) -> None:
    """--cache-remote."""
    p.add_argument("--cache-remote", metavar="URL", default=None,
                   help="shared remote cache, e.g. s3://bucket/prefix or file:///shared/cache (default: "
                        "$COSYCOMPILE_CACHE_REMOTE; '' for none). Missing steps are pulled and verified, built "
                        "steps pushed; S3 credentials and endpoint come from the AWS environment "
                        "(AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, ...). A remote that does not answer costs one "
                        "operation's budget ($COSYCOMPILE_REMOTE_BUDGET_S sets it), then the "
                        "build goes on locally")


def add_spin_wait(p: argparse.ArgumentParser) -> None:
    """--spin-wait, for the CPU models of a Triton repository."""
    p.add_argument("--spin-wait", action="store_true",
                   help="CPU models: let idle engine threads spin-wait for the next op instead of sleeping (ONNX "
                        "Runtime's allow_spinning; may pay where an instance has cores to spare, but on a 2-core "
                        "machine requests ran slower with it, with one instance or two)")
