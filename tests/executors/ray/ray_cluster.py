"""A real Ray cluster for tests, on loopback only: this test process enters a private network
namespace (loopback is its only interface, so Ray, which replaces 127.0.0.1 by the machine's
interface address, can bind nothing else), starts `ray start --block` nodes with their own
resources, and kills every process of the namespace when done."""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

CLONE_NEWNET = 0x40000000
GCS_PORT = 6379  # the namespace has its own ports: no other cluster can hold this one
RAY = Path(sys.executable).with_name("ray")


def _loopback_up() -> None:
    # SIOCGIFFLAGS / SIOCSIFFLAGS on "lo": what `ip link set lo up` does, without needing iproute2.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, req))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 0x1))


def _netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


@contextmanager
def private_network() -> Iterator[str]:
    """This thread, and every process it starts from now on, in a new network namespace with only
    loopback up; on exit every process left in it is killed and the thread returns to its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:
        os.close(own)
        pytest.skip(f"no private network namespace here: {os.strerror(ctypes.get_errno())}")
    ns = os.readlink("/proc/thread-self/ns/net")
    try:
        _loopback_up()
        yield ns
    finally:
        me = os.getpid()
        for pid in _pids():
            if pid != me and _netns(pid) == ns:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        libc.setns(own, CLONE_NEWNET)
        os.close(own)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RayNode:
    """One `ray start --block` node: its label (``$COSYCOMPILE_NODE``), its own cache folder and resources."""

    def __init__(self, label: str, work: Path, env: dict[str, str], head: bool, cpus: int,
                 resources: str | None = None, gpus: int = 0) -> None:
        self.label, self.artifacts = label, work / f"node-{label}"
        self.temp_dir: Path | None = None
        self.log_path = work / f"{label}.log"
        args = [str(RAY), "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
                "--object-store-memory=80000000", "--disable-usage-stats"]
        if head:
            # Ray's sockets live under its temp dir and a socket path may not exceed 107 bytes: pytest's
            # tmp paths (with xdist's popen-gwN) are too deep for it, so the head gets a short one.
            self.temp_dir = Path(tempfile.mkdtemp(prefix="ccray-", dir="/tmp"))
            args += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false", f"--temp-dir={self.temp_dir}"]
        else:
            args += [f"--address=127.0.0.1:{GCS_PORT}"]
        if resources:
            args.append(f"--resources={resources}")
        if gpus:  # Ray takes the count as given: a node that says it has a GPU without having one
            args.append(f"--num-gpus={gpus}")
        node_env = {**env, "COSYCOMPILE_NODE": label, "COSYCOMPILE_NODE_ARTIFACTS": str(self.artifacts),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, env=node_env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self) -> None:
        """SIGKILL of the node: its `ray start`, raylet and workers."""
        for pid in descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(timeout=30)
        self.log.close()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def wait_for_nodes(n: int, env: dict[str, str], timeout: float = 180, nodes: "list[RayNode] | None" = None) -> None:
    """Until the cluster has ``n`` live nodes (a bounded wait). Ray's own connect retries a GCS that
    is not listening yet without end, so each probe runs only once the port accepts, under a timeout."""
    probe = ("import ray, logging; ray.init(address='127.0.0.1:%d', logging_level=logging.ERROR); "
             "print(sum(x['Alive'] for x in ray.nodes()))" % GCS_PORT)
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        for node in nodes or []:
            if node.proc.poll() is not None:  # `ray start --block` ended: the node is not coming
                tail = node.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise AssertionError(f"ray node {node.label} exited {node.proc.returncode}: " + " | ".join(tail))
        try:
            with socket.create_connection(("127.0.0.1", GCS_PORT), timeout=2):
                pass
            res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                                 timeout=max(5.0, min(60.0, deadline - time.monotonic())))
            seen = res.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            seen = ""
        if seen == str(n):
            return
        time.sleep(1)
    raise AssertionError(f"the Ray cluster has {seen or 'no'} live nodes after {timeout:.0f}s, expected {n}")
