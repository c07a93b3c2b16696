"""``cosycompile serve BUNDLE``: the real tritonserver on a CPU bundle, in one command.

Writes the bundle's Triton repository and the python-backend dir (from the ``nvidia-pytriton``
wheel) into a work dir, starts ``tritonserver`` bound to 127.0.0.1 unless told otherwise, waits
until it reports ready (bounded), prints where it listens, and runs in the foreground until Ctrl-C
or SIGTERM, which stop the server (killed if it does not stop in time) and remove the work dir.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cosycompile.commands._args import add_spin_wait
from cosycompile.errors import UserError

ORDER = 125
EXAMPLES = (
    ("cosycompile serve DIR", "serve a CPU bundle with the real tritonserver on 127.0.0.1"),
)
STOP_GRACE_S = 30.0  # how long a stopping server may take before it is killed


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    from cosycompile.exporters.triton.repository import RepoOptions

    d = RepoOptions()
    p = sub.add_parser("serve", help="serve a CPU bundle with the real tritonserver (loopback by default)",
                       description="Write BUNDLE's Triton repository (as `cosycompile triton` does) and serve it with "
                                   "the tritonserver of the nvidia-pytriton wheel until Ctrl-C. Its models: FAMILY "
                                   "(gRPC streaming) and FAMILY_offline (HTTP); see the repository's README.md.")
    p.add_argument("bundle", type=Path, help="CPU bundle dir (every stage on onnxruntime)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default %(default)s; 0.0.0.0 opens it to the network)")
    p.add_argument("--http-port", type=int, default=8000, metavar="PORT", help="HTTP port (default %(default)s)")
    p.add_argument("--grpc-port", type=int, default=8001, metavar="PORT", help="gRPC port (default %(default)s)")
    p.add_argument("--instances", type=int, default=2, metavar="N",
                   help="instances per model: requests run in parallel up to N (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads per instance (default: the recipe's validation.speed.threads)")
    add_spin_wait(p)
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, metavar="N",
                   help="longest text one request may send; longer ones are refused at once (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, metavar="SECONDS",
                   help="a request still running after this stops at its next chunk (streaming) or text "
                        "piece (default %(default)s)")
    p.add_argument("--ready-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="how long the server may take to load the models (default %(default)s)")
    p.add_argument("--log", type=Path, default=None, metavar="FILE",
                   help="server log (default: server.log in the work dir, removed at exit)")
    return p


def _check_port(host: str, port: int, flag: str) -> None:
    if not 1 <= port <= 65535:
        raise UserError(f"{flag} {port}: not a port (1-65535)")
    with socket.socket() as s:
        # As the server binds: a port whose last connections are in TIME_WAIT is free to listen on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as exc:
            raise UserError(f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror})") from None


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E") or "error" in ln.lower()]
    return (errors or lines or ["(empty log)"])[-1][:300]


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
    return proc.returncode


def run(args: argparse.Namespace) -> int:
    """The ``serve`` command."""
    from cosycompile.exporters.triton.repository import RepoOptions, bundle_layout, write_repository
    from cosycompile.exporters.triton.server import (prepare_backend_dir, server_command, server_env,
                                                     tritonserver_binary)
    from cosycompile.runtime.bundle import bundle_parts

    manifest, _ = bundle_parts(args.bundle)
    if bundle_layout(manifest, args.bundle) != "cpu":
        raise UserError(f"{args.bundle}: a GPU bundle; serve runs CPU bundles (for a GPU one, write its repository "
                        f"with `cosycompile triton` and serve it with NVIDIA's tritonserver container)")
    for flag, value, low in (("--instances", args.instances, 1), ("--max-text-chars", args.max_text_chars, 1)):
        if value < low:
            raise UserError(f"{flag} {value}: needs at least {low}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: needs at least 1")
    for flag, value in (("--request-timeout", args.request_timeout), ("--ready-timeout", args.ready_timeout)):
        if not 0 < value < float("inf"):
            raise UserError(f"{flag} {value}: needs a finite number of seconds above 0")
    if args.log is not None:
        from cosycompile.commands._output import check_out_file

        check_out_file(args.log, "--log", "give a new or plain file's path for the server log")
    _check_port(args.host, args.http_port, "--http-port")
    _check_port(args.host, args.grpc_port, "--grpc-port")
    binary = tritonserver_binary()
    if binary is None:
        raise UserError("tritonserver is not installed: pip install --no-deps nvidia-pytriton==0.7.0")

    work = Path(tempfile.mkdtemp(prefix="cosycompile-serve-"))
    proc: subprocess.Popen | None = None
    log_file = None
    try:
        options = RepoOptions(instances=args.instances, threads=args.threads, max_text_chars=args.max_text_chars,
                              request_timeout_s=args.request_timeout, spin_wait=args.spin_wait)
        repo = write_repository(args.bundle, work / "repo", options)
        backends = prepare_backend_dir(work / "backends")
        log = args.log or work / "server.log"
        log_file = open(log, "w")
        # The metrics port is off (--allow-metrics false) but must still be a free one: pick it here.
        with socket.socket() as s:
            s.bind((args.host, 0))
            metrics = s.getsockname()[1]
        proc = subprocess.Popen(server_command(repo, backends, args.http_port, args.grpc_port, metrics, binary,
                                               host=args.host), env=server_env(), stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        http = f"{args.host if args.host != '0.0.0.0' else '127.0.0.1'}:{args.http_port}"
        # A log in the work dir is removed at exit: an error then carries its last error line only.
        kept = f" (log: {log})" if args.log else " (--log FILE keeps the whole log)"
        deadline = time.monotonic() + args.ready_timeout
        while not _ready(http):
            if proc.poll() is not None:
                raise UserError(f"tritonserver exited with {proc.returncode} while loading: {_last_error(log)}{kept}")
            if time.monotonic() > deadline:
                raise UserError(f"tritonserver not ready after {args.ready_timeout:g} s: {_last_error(log)}{kept}")
            time.sleep(0.5)
        print(f"serving {args.bundle} ({args.instances} instance{'s' if args.instances != 1 else ''} per model): "
              f"HTTP {args.host}:{args.http_port}, gRPC {args.host}:{args.grpc_port}; repository {repo}; log {log}; "
              f"Ctrl-C stops",
              flush=True)
        rc = proc.wait()
        raise UserError(f"tritonserver stopped by itself with {rc}: {_last_error(log)}{kept}")
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr, flush=True)  # the server is stopped below, as on every way out
        return 0
    finally:
        if proc is not None:
            _stop(proc)
        if log_file is not None:
            log_file.close()
        shutil.rmtree(work, ignore_errors=True)
