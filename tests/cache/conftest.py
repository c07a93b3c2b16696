"""Real S3 servers on loopback, one of each per test module that asks for it (see ``s3_servers``)."""

from __future__ import annotations

from typing import Iterator

import pytest

from s3_servers import MotoServer, SeaweedServer


@pytest.fixture(scope="module")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()
