"""``python -m cosycompile.backends.trtllm.smoke CHECKPOINT OPTIONS_YAML``: load the checkpoint with
``tensorrt_llm.LLM`` under the build's LLM-API options and decode a few tokens from the CosyVoice2
prompt ``[sos | text | task_id]``; prints JSON. Runs in its own process (the build's one call into
TensorRT-LLM), so a failed load cannot take the build process down."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(checkpoint: str, options_file: str) -> dict:
    """Load, generate 4 tokens greedily, and say which ids came back and whether they are speech ids."""
    import yaml
    from tensorrt_llm import LLM, SamplingParams

    options = yaml.safe_load(Path(options_file).read_text())
    tmap = json.loads((Path(checkpoint) / "cosycompile_llm.json").read_text())["token_map"]
    prompt = [tmap["sos_id"], 1, 2, 3, tmap["task_id_id"]]
    llm = LLM(model=checkpoint, trust_remote_code=True, **options)
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, end_id=tmap["eos_id"],
                                                stop_token_ids=tmap["stop_ids"]))
    ids = list(out[0].outputs[0].token_ids)
    lo, hi = tmap["speech_ids"]
    return {"prompt": prompt, "tokens": ids, "all_speech": all(lo <= t < hi for t in ids)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
