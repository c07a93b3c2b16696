"""Connecting to a Ray cluster within a bounded time, and what its live nodes offer."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

from cosycompile.errors import UserError

CONNECT_TIMEOUT_S = 5.0
CONNECT_TRIES = 2
CONNECT_RETRY_PAUSE_S = 3.0


@dataclass(frozen=True)
class Node:
    """A live node: its Ray id and the resources it was started with (``CPU``, ``sm89``, ...)."""

    node_id: str
    address: str
    resources: dict[str, float]

    def offers(self, resource: str) -> bool:
        return self.resources.get(resource, 0.0) > 0


def import_ray() -> Any:
    """Ray, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray on this machine and every node: "
                        "pip install 'cosycompile[ray]'") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    text = address.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"Ray cluster address {address!r}: expected HOST:PORT (e.g. ray://head:10001 or, "
                        "in $RAY_ADDRESS, head:6379)")
    return host.strip("[]"), int(port)


def connect(address: str) -> Any:
    """``ray.init`` on the cluster at ``address``, never starting a cluster of its own.

    Ray's own connect retries an address that does not answer without end, so the address is
    first probed with a plain TCP connect of :data:`CONNECT_TIMEOUT_S`: a wrong or dead address is a
    one-line error in seconds.
    """
    ray = import_ray()
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(f"Ray cluster {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
                        "start the head with `ray start --head` or fix the address") from None
    # Past the probe, Ray's own connect can still fail on a busy head ("Starting Ray client server
    # failed", a GCS that times out): once more after a pause, then one line, never a traceback.
    failure = ""
    for attempt in range(CONNECT_TRIES):
        try:
            # The workers' output is not forwarded: the driver prints one line per step, and a
            # failing step's error comes back with its task.
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     configure_logging=True)
            return ray
        except Exception as exc:  # Ray raises RuntimeError, ConnectionError or its own classes here
            failure = f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            ray.shutdown()  # a half-made connection is not reused by the next try
            if attempt + 1 < CONNECT_TRIES:
                time.sleep(CONNECT_RETRY_PAUSE_S)
    raise UserError(f"Ray cluster {address}: connecting failed {CONNECT_TRIES} times ({failure[:300]}); "
                    "check the head with `ray status` and try again")


def live_nodes(ray: Any) -> list[Node]:
    """The cluster's live nodes."""
    return [Node(n["NodeID"], n.get("NodeManagerAddress", ""), dict(n.get("Resources") or {}))
            for n in ray.nodes() if n.get("Alive")]


def describe(nodes: list[Node]) -> str:
    """``2 nodes (CPU 1; CPU 1, sm89 1)``: what the driver saw when it planned."""
    def one(n: Node) -> str:
        shown = {k: v for k, v in n.resources.items()
                 if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type:"))}
        return ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items()))

    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} (" + "; ".join(one(n) for n in nodes) + ")"
