"""Write the token ids upstream's 25 Hz text tokenizer gives a few texts, to pin cosycompile's encoder to it.

Runs ``cosyvoice.tokenizer.tokenizer.get_tokenizer(multilingual=True, num_languages=100)`` of upstream
FunAudioLLM/CosyVoice at commit ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 over its own vocabulary
(``cosyvoice/tokenizer/assets/multilingual_zh_ja_yue_char_del.tiktoken``) with the real ``tiktoken``
package, and writes ``tests/data/cv1_upstream/tokenizer_cases.json`` (texts and ids). Upstream wraps the
encoding in openai-whisper's ``Tokenizer``, which is stubbed here (its ``encode`` is the encoding's).

Re-run from the repository root (``tiktoken`` in the venv only; not a project dependency)::

    .venv/bin/python -m pip install tiktoken
    .venv/bin/python tests/families/cosyvoice/make_upstream_fixtures_tokenizer.py <upstream git dir or tree>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "data" / "cv1_upstream" / "tokenizer_cases.json"
COMMIT = "ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40"
TEXTS = ["Hello, world! It's 3.14 o'clock.",
         "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。",
         "  spaces   and\nnewlines\t<|endoftext|> [laughter] <|HAPPY|>ok",
         "日本語のテキスト、한국어 텍스트 ümlaut café", "<|0.02|><|TTS/SP03|>x",
         "The quick brown fox jumps over the lazy dog 12345 ... !!! ???"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("upstream", type=Path, help="upstream's source tree, or a git dir holding the commit")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.upstream
        if not (root / "cosyvoice").is_dir():
            archive = subprocess.run(["git", f"--git-dir={root}", "archive", COMMIT, "cosyvoice/tokenizer"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            root = Path(tmp)
        sys.path.insert(0, str(root))
        whisper, whisper_tok = types.ModuleType("whisper"), types.ModuleType("whisper.tokenizer")

        class Tokenizer:  # openai-whisper's wrapper: only its encode is used
            def __init__(self, encoding: object, **_: object) -> None:
                self.encoding = encoding

        whisper_tok.Tokenizer = Tokenizer
        sys.modules.update({"whisper": whisper, "whisper.tokenizer": whisper_tok})
        from cosyvoice.tokenizer.tokenizer import get_tokenizer

        enc = get_tokenizer(multilingual=True, num_languages=100, language="en", task="transcribe").encoding
        cases = [{"text": t, "ids": enc.encode(t, allowed_special="all")} for t in TEXTS]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"commit": COMMIT, "n_vocab": enc.n_vocab, "cases": cases}, ensure_ascii=False,
                              indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
