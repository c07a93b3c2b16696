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
                        "(AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3, ...)")
