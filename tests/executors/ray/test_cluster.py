"""Connecting to a Ray cluster (cosycompile/executors/ray/cluster.py) when Ray's own connect fails past
the address probe. A real head cannot be made to fail on cue, so ``ray.init`` is the one call faked:
it raises what Ray raised under load in the suite ("Starting Ray client server failed"); the address
probe is real (a listening loopback socket)."""

from __future__ import annotations

import socket
from typing import Any, Iterator

import pytest

from cosycompile.errors import UserError
from cosycompile.executors.ray import cluster


class FlakyRay:
    """``ray.init`` failing ``failures`` times, then connecting; every call and shutdown counted."""

    def __init__(self, failures: int) -> None:
        self.failures, self.inits, self.shutdowns = failures, 0, 0

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise RuntimeError("Starting Ray client server failed. See ray_client_server_23000.err for details.\n"
                               "second line of Ray's message")

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def head() -> Iterator[str]:
    """A loopback address something listens on, so the TCP probe passes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "CONNECT_RETRY_PAUSE_S", 0.0)


def test_a_connect_that_fails_once_is_tried_again(monkeypatch: pytest.MonkeyPatch, head: str) -> None:
    ray = FlakyRay(failures=1)
    monkeypatch.setattr(cluster, "import_ray", lambda: ray)
    assert cluster.connect(head) is ray
    assert (ray.inits, ray.shutdowns) == (2, 1)


def test_a_connect_that_keeps_failing_is_one_line(monkeypatch: pytest.MonkeyPatch, head: str) -> None:
    ray = FlakyRay(failures=cluster.CONNECT_TRIES)
    monkeypatch.setattr(cluster, "import_ray", lambda: ray)
    with pytest.raises(UserError) as err:
        cluster.connect(head)
    text = str(err.value)
    assert "\n" not in text and f"connecting failed {cluster.CONNECT_TRIES} times" in text
    assert "RuntimeError: Starting Ray client server failed" in text and "ray status" in text
    assert (ray.inits, ray.shutdowns) == (cluster.CONNECT_TRIES, cluster.CONNECT_TRIES)
