"""Test helpers importable from every test folder (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

REPO = Path(__file__).resolve().parents[1]
EVAL_SET = REPO / "calib_data" / "eval"
def write_recipe(path: Path, body: dict | str, base: bool = True) -> Path:
    """Write a recipe YAML; with ``base`` it extends the repo's recipes/base.yaml."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(body, str):
        path.write_text(body)
        return path
    data = dict(body)
    if base:
        data.setdefault("extends", str(REPO / "recipes" / "base.yaml"))
        data.setdefault("validation", {}).setdefault("eval_set", str(EVAL_SET))
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess."""
    return subprocess.run([sys.executable, "-m", "cosycompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def until_outputs(stdout: str) -> dict[str, Path]:
    """The ``  <step>: <dir>`` lines that ``cosycompile build --until`` prints, as a dict."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and ": /" in line:
            name, path = line.strip().split(": ", 1)
            out[name] = Path(path)
    return out


@contextmanager
def triton_http(address: str, timeout_s: float = 600) -> Iterator[Any]:
    """A tritonclient HTTP client of the server at ``address``, closed on exit: an open connection
    holds tritonserver's exit (SIGTERM) for its whole exit timeout, 30 s."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(address, connection_timeout=timeout_s, network_timeout=timeout_s)
    try:
        yield client
    finally:
        client.close()


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free at the time of asking."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextmanager
def tritonserver(repo: Path, work: Path, ready_s: float = 180) -> Iterator[dict[str, Any]]:
    """The real tritonserver (nvidia-pytriton's, python backend) on ``repo``, on loopback ports, ready;
    stopped (killed if need be) on exit. Yields its process, ``http`` and ``grpc`` addresses and log path."""
    import pytest

    from cosycompile.exporters.triton.server import prepare_backend_dir, server_command, server_env, tritonserver_binary

    if tritonserver_binary() is None:
        pytest.fail("tritonserver is not installed: make install (pip install --no-deps nvidia-pytriton==0.7.0)")
    work.mkdir(parents=True, exist_ok=True)
    http, grpc, metrics = free_ports(3)
    log_path = work / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(server_command(repo, prepare_backend_dir(work / "backends"), http, grpc, metrics),
                            env=server_env(), stdout=log, stderr=subprocess.STDOUT)
    state = {"proc": proc, "http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}", "log": log_path}
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tritonserver exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://{state['http']}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"tritonserver not ready in {ready_s:.0f} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield state
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        log.close()


def cv3_network_greedy(lm: Any, text: Any, prompt_text: Any, prompt_speech: Any, max_tokens: int) -> list[int]:
    """Greedy decoding written against CosyVoice3's LM network as upstream's ``CosyVoice3LM`` runs it:
    prefill, then one token at a time; row S masked before ``min_len`` (text length times the config's
    ratio), any of the 200 ids from S on stops; at most ``max_tokens`` (and the config's maximum)."""
    import torch

    c = lm.cfg
    n = len(text)
    min_len, max_len = int(n * c.min_token_text_ratio), min(int(n * c.max_token_text_ratio), max_tokens)
    as_batch = lambda ids: torch.as_tensor(ids, dtype=torch.int64).reshape(1, -1)  # noqa: E731
    emb = lm.prompt_embeddings(as_batch(text), as_batch(prompt_text), as_batch(prompt_speech))
    out: list[int] = []
    cache = None
    with torch.inference_mode():
        for i in range(max_len):
            logits, cache = lm.step(emb, cache)
            logp = logits[0, -1].double().log_softmax(-1)
            if i < min_len:
                logp = lm.mask_before_min_len(logp)
            token = int(logp.argmax())
            if token in lm.stop_token_ids:
                break
            out.append(token)
            emb = lm.speech_embedding.weight[token].reshape(1, 1, -1)
    return out


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command (exit 2), asserted to be exactly one line."""
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cosycompile: error: "), res.stderr
    return lines[0]


def parse_model_config(path: Path) -> Any:
    """A ``config.pbtxt`` parsed with Triton's own ``ModelConfig`` proto."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def config_tensors(parsed: Any) -> dict[str, tuple[str, list[int], bool]]:
    """name -> (Triton data type, dims, optional) of a parsed config's inputs and outputs."""
    from tritonclient.grpc import model_config_pb2

    return {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims), bool(getattr(t, "optional", False)))
            for t in [*parsed.input, *parsed.output]}


def instance_kind(group: Any) -> str:
    """``KIND_CPU`` / ``KIND_GPU`` of a parsed instance group."""
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)


def fake_distribution(folder: Path, name: str, version: str, top_level: str | None = None) -> None:
    """A dist-info as pip writes it, holding only what importlib.metadata reads: first on a process's
    PYTHONPATH, it stands for another build of a tool installed there (a CUDA torch, onnxruntime-gpu)."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level + "\n")
