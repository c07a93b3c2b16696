"""``cosycompile serve BUNDLE`` (issue 39, item 4): the real tritonserver on 127.0.0.1 in one command,
requests in parallel on 2 instances, an over-long request refused at once, a log without a
traceback, and SIGTERM stopping it all with nothing left behind."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from helpers import free_ports, one_line_error, run_cli, triton_http
from hostile_harness import CachedBuild

pytestmark = pytest.mark.slow
TEXT = "Hello there, this is a sentence for the server to say out loud."


@pytest.fixture(scope="module")
def served(followup: CachedBuild, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    (bundle,) = (followup.art / "builds").glob("followup-*")
    http, grpc = free_ports(2)
    log = tmp_path_factory.mktemp("serve") / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "cosycompile", "serve", str(bundle), "--http-port", str(http),
                             "--grpc-port", str(grpc), "--instances", "2", "--threads", "1", "--max-text-chars", "300",
                             "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while not any(ln.startswith("serving ") for ln in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"serve did not come up (exit {proc.poll()}): {(proc.stderr.read() if proc.stderr else '')[-2000:]}")
        time.sleep(0.2)
    state = {"proc": proc, "http": f"127.0.0.1:{http}", "grpc": grpc, "log": log, "lines": lines}
    try:
        yield state
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def _infer(http: str, text: str) -> tuple[np.ndarray | None, str]:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    data = np.frombuffer(text.encode(), np.uint8)[None]
    inp = httpclient.InferInput("target_text_utf8", list(data.shape), "UINT8")
    inp.set_data_from_numpy(data)
    with triton_http(http, timeout_s=300) as client:
        try:
            return client.infer("cosyvoice2_offline", [inp]).as_numpy("waveform"), ""
        except InferenceServerException as exc:
            return None, str(exc)


def _compute_ns(http: str) -> tuple[int, int]:
    """(successful requests, summed compute time in ns) of the offline model, from Triton's statistics."""
    with urllib.request.urlopen(f"http://{http}/v2/models/cosyvoice2_offline/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"]), sum(int(stats[k]["ns"]) for k in ("compute_input", "compute_infer",
                                                                                "compute_output"))


def test_it_listens_on_loopback_only(served: dict[str, Any]) -> None:
    assert served["lines"][0].startswith("serving ") and "HTTP 127.0.0.1:" in served["lines"][0]
    with socket.socket() as s:
        s.settimeout(5)
        s.connect(("127.0.0.1", int(served["http"].split(":")[1])))
    port = int(served["http"].split(":")[1])
    listening = _listeners(port)
    assert listening and all(addr == "127.0.0.1" for addr in listening), listening


def _listeners(port: int) -> list[str]:
    """The IPv4 addresses with a socket listening on ``port`` (from /proc/net/tcp; IPv6 ones as "ipv6")."""
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.append("ipv6" if v6 else socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def test_four_requests_run_in_parallel_on_two_instances(served: dict[str, Any]) -> None:
    n0, ns0 = _compute_ns(served["http"])
    results: list[Any] = [None] * 4
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, _infer(served["http"], TEXT)))
               for k in range(4)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    assert all(r is not None and r[0] is not None for r in results), results
    assert all(np.array_equal(results[0][0], r[0]) for r in results)  # same text, same seed: same audio
    # Triton counts a request once the model has released it, which can come just after the client
    # has its response: wait (bounded) for the fourth to be counted.
    deadline = time.monotonic() + 30
    while (stats := _compute_ns(served["http"]))[0] < n0 + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    n1, ns1 = stats
    busy = (ns1 - ns0) / 1e9
    print(f"\n4 requests: wall {wall:.2f} s, summed compute {busy:.2f} s")
    assert n1 - n0 == 4
    # One instance at a time could not add up to more compute than wall time.
    assert busy > 1.3 * wall, (busy, wall)


def test_an_over_long_request_is_refused_at_once(served: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    wav, err = _infer(served["http"], "word " * 100)
    assert wav is None and "500 characters; this server takes at most 300" in err, err
    assert time.perf_counter() - t0 < 5


def test_the_log_has_no_traceback_and_sigterm_stops_it(served: dict[str, Any]) -> None:
    wav, _ = _infer(served["http"], TEXT)
    assert wav is not None
    proc = served["proc"]
    repo = Path(served["lines"][0].split("; repository ")[1].split(";")[0])
    assert (repo / "cosyvoice2_offline" / "config.pbtxt").is_file()
    log = served["log"].read_text()
    assert "Traceback" not in log
    # Two instances of each model share the cores: their idle engine threads sleep (serve's default).
    assert log.count("1 threads, idle threads sleep,") == 4, log[-3000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)
    assert proc.returncode == 0 and "stopped" in (proc.stderr.read() if proc.stderr else "")
    assert not repo.parent.exists(), "the work dir was left behind"
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", int(served["http"].split(":")[1]))) != 0, "the server still listens"


def test_a_port_in_use_is_one_line(followup: CachedBuild) -> None:
    (bundle,) = (followup.art / "builds").glob("followup-*")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        line = one_line_error(run_cli("serve", str(bundle), "--http-port", str(port), "--grpc-port", str(port + 1),
                                      timeout=60))
    assert f"--http-port {port}: cannot listen on 127.0.0.1:{port}" in line
