"""Claims on the remote cache: one machine builds a step, the others wait for its entry and pull it.

Without them, two machines (two cluster nodes, two CI runners, two drivers) that miss the same key at
the same moment both build it; the remote keeps the first writer's entry, so nothing is wrong, but
an hour of calibration or an engine build is done twice. Before building a key the remote lacks, a
build claims it by creating ``claims/<key>/<generation>.json`` with a conditional create, so exactly
one claimant wins each generation. The holder rewrites its claim every ``ttl / 4`` seconds (a
heartbeat) while it builds and pushes, and deletes it once the entry is published.

Another build that finds a live claim waits: it polls until the entry appears (and pulls it), or
the claim goes away without one (the holder failed; this build claims and builds it). A claim
whose bytes have not changed for ``ttl`` seconds of the waiter's own clock is stale: its holder was
killed or lost the network, and the waiter claims the next generation, which again only one waiter
wins. No clocks are compared across machines. A holder cut off from the remote for longer than
``ttl`` may lose its claim: the step is then built twice and the first push wins, as without claims
(wasted work, never a wrong entry).

``$COSYCOMPILE_CLAIM_TTL_S`` sets ``ttl`` (:data:`TTL_S` by default; read when the remote cache is
opened): how long a killed holder keeps the others waiting.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from cosycompile.core.graph import node_name

if TYPE_CHECKING:
    from cosycompile.cache.local import Store
    from cosycompile.cache.remote import RemoteCache

TTL_S = 60.0
TTL_ENV = "COSYCOMPILE_CLAIM_TTL_S"
TTL_RANGE = (2.0, 3600.0)
FOLDER = "claims"
# A claim untouched for this long belongs to no live build whatever the ttl: remote gc removes it.
GC_AGE_S = 2 * TTL_RANGE[1]


def ttl_from_env() -> float:
    """``$COSYCOMPILE_CLAIM_TTL_S``, else :data:`TTL_S`; a value outside :data:`TTL_RANGE` is a UserError."""
    from cosycompile.cache.remote import seconds_from_env

    return seconds_from_env(TTL_ENV, TTL_S, TTL_RANGE, "the seconds after which a silent claim is taken over")


def _rel(key: str, generation: int) -> str:
    return f"{FOLDER}/{key}/{generation:08d}.json"


def _generations(remote: RemoteCache, key: str) -> list[int]:
    names = remote.list_folder(f"{FOLDER}/{key}")
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


class Claim:
    """A held claim: its heartbeat runs on a thread (with its own connection) until :meth:`release`."""

    def __init__(self, remote: RemoteCache, key: str, generation: int, body: dict[str, Any], ttl: float) -> None:
        from cosycompile.cache.remote import RemoteCache

        self.key, self.generation, self.body = key, generation, body
        # Its own instance: a RemoteCache holds the deadline of the operation under way, and the
        # builder's pushes and the heartbeat overlap.
        self._remote = RemoteCache(remote.url, remote.storage_options, budget_s=remote.budget_s)
        self._period = ttl / 4
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim {key[:12]}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._period):
            self.body["beat"] += 1
            try:
                self._remote.put_object(_rel(self.key, self.generation), _encode(self.body))
            except Exception:  # noqa: BLE001 - the next beat tries again; a long outage only risks a second build
                pass

    def release(self) -> None:
        """Stop the heartbeat and delete this claim and the stale generations below it (best effort:
        a claim left behind goes stale after ``ttl``)."""
        self._stop.set()
        self._thread.join(timeout=self._period + 1)
        for generation in range(self.generation, -1, -1):
            try:
                self._remote.remove_object(_rel(self.key, generation))
            except Exception:  # noqa: BLE001 - see the docstring
                return


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True).encode()


def _holder(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        return f"{body['holder']} (pid {body['pid']})"
    except (ValueError, KeyError, TypeError):
        return "another build"


def acquire(remote: RemoteCache, store: Store, key: str, step: str, waiting: Callable[[str], None],
            ttl: float | None = None) -> Claim | None:
    """Block until this build holds the claim on ``key`` (returned; release it after the push) or
    the remote has ``key``'s entry (pulled into ``store``; None). Call holding ``store.lock(key)``.

    Each poll is one remote operation with its deadline, so a dead server raises a RemoteError
    within one budget; the wait itself lasts as long as a live holder builds, or ``ttl`` after its
    heartbeat stops.
    """
    from cosycompile.cache.remote import RemoteCorrupt

    ttl = remote.claim_ttl_s if ttl is None else ttl
    poll = min(2.0, ttl / 8)
    seen: tuple[int, bytes] | None = None
    since = time.monotonic()
    told = ""
    corrupt = False  # the remote's entry for the key failed verification: build and push a good copy

    def pulled() -> bool:
        nonlocal corrupt
        if corrupt or not remote.has(key):
            return False
        try:
            return remote.pull(store, key) is not None
        except RemoteCorrupt:
            corrupt = True
            return False

    while True:
        if pulled():
            return None
        generations = _generations(remote, key)
        generation = 0
        if generations:
            top = generations[-1]
            raw = remote.read_object(_rel(key, top))
            if raw is None:  # released between the listing and the read: look again
                continue
            now = time.monotonic()
            if seen != (top, raw):
                seen, since = (top, raw), now
                if _holder(raw) != told:
                    told = _holder(raw)
                    waiting(f"{told} is building it; waiting for its entry")
                time.sleep(poll)
                continue
            if now - since < ttl:
                time.sleep(poll)
                continue
            generation = top + 1  # silent for ttl: its holder is gone
            waiting(f"{_holder(raw)} went silent {ttl:.0f} s ago; taking the step over")
        body = {"holder": node_name(), "pid": os.getpid(), "step": step, "claimed": time.time(), "beat": 0}
        if not remote.create_object(_rel(key, generation), _encode(body)):
            time.sleep(poll / 4)  # another claimant won this generation: wait on it
            continue
        claim = Claim(remote, key, generation, body, ttl)
        # The holder that just released may have published between our lookup and our create.
        if pulled():
            claim.release()
            return None
        return claim
