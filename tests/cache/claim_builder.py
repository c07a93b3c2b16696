"""Run by test_claims in a process of its own, as another machine would: build a toy chain (a, b -> c)
into an artifacts dir of its own with a shared remote, every step slow enough for two such builders
to overlap.

Usage: python -c "import claim_builder; claim_builder.main()" ROOT REMOTE_URL TAG GO_FILE
(the log of bodies run: $CLAIM_TEST_LOG). Imported, not run as a script: a step's key digests its module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cosycompile.cache.local import Store  # noqa: E402
from cosycompile.cache.remote import RemoteCache  # noqa: E402
from cosycompile.core.graph import Executor, Reporter, StateFile, Step, StepContext  # noqa: E402

BODY_S = 1.0


def slow_writer(ctx: StepContext) -> dict:
    # The log path is not a param: params are in the key, and both builders must compute the same keys.
    with open(os.environ["CLAIM_TEST_LOG"], "a") as log:
        log.write(f"{ctx.name} {os.getpid()}\n")
    time.sleep(BODY_S)
    text = str(ctx.params["value"]) + "".join((p / "out.txt").read_text() for p in ctx.inputs.values())
    (ctx.out / "out.txt").write_text(text)
    return {}


def chain(tag: str) -> Step:
    a = Step("a", "claim-test.a", slow_writer, params={"value": f"a-{tag}"})
    b = Step("b", "claim-test.b", slow_writer, params={"value": f"b-{tag}"})
    return Step("c", "claim-test.c", slow_writer, params={"value": "c"}, deps={"a": a, "b": b})


def main() -> None:
    root, url, tag, go = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    ex = Executor(Store(root), [chain(tag)], StateFile(root / "state.json"), Reporter(stream=sys.stdout),
                  remote=RemoteCache(url))
    (root.parent / f"{root.name}.ready").touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:  # both builders start their builds together
        time.sleep(0.01)
    res = ex.run()
    print("RESULT " + json.dumps({"ran": res.ran, "pulled": res.pulled, "cached": res.cached,
                                  "files": {s: (e.data / "out.txt").read_text() for s, e in res.entries.items()}}))
