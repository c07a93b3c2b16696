"""Steps as tasks on a Ray cluster, placed by the hardware each needs; the remote cache carries every
artifact between nodes (``--executor ray://HOST:PORT`` or ``$RAY_ADDRESS``)."""

from __future__ import annotations

from cosycompile.executors import ExecutorInfo

PLUGIN = ExecutorInfo(
    summary="steps as Ray tasks: GPU-kind steps on nodes offering the target's sm tag as a resource, "
            "the rest on any node; artifacts travel through --cache-remote",
    address_env="RAY_ADDRESS", extra="ray", takes_force=False,
)
