"""What a bundle, a server or a Triton model imports must not pull in torch (or the build side)."""

from __future__ import annotations

import subprocess
import sys


def test_runtime_modules_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import cosycompile.runtime.pipeline, cosycompile.runtime.loading, cosycompile.runtime.frontend\n"
        "import cosycompile.runtime.dsp, cosycompile.runtime.dataset, cosycompile.runtime.sampling\n"
        "import cosycompile.runtime.graphspec, cosycompile.runtime.graphs_dir, cosycompile.runtime.runner\n"
        "from cosycompile.stages import stage_infos; from cosycompile.backends import backend_infos\n"
        "stage_infos(); backend_infos()\n"
        "bad = sorted(m for m in ('torch', 'transformers', 'modelopt', 'onnx') if m in sys.modules)\n"
        "from cosycompile.families import family_infos, stage_runtime_class\n"
        "[stage_runtime_class(s, {'family': f}) for f in family_infos() for s in stage_infos()]\n"
        "heavy = ('loader', 'qwen2lm', 'flow', 'flow_encoder', 'flow_decoder', 'hift')\n"
        "build_side = sorted(m for m in sys.modules if m.startswith(('cosycompile.quantize.', 'cosycompile.reference'))"
        " or (m.startswith('cosycompile.families.') and m.rsplit('.', 1)[1] in heavy))\n"
        "print(bad, build_side)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[] []", res.stdout
