"""Hostile input: each case is refused as ``hostile_harness.refused`` checks (one line naming the
file and key or line, exit 2, bounded time and memory, nothing written that a build trusts, a
follow-up build still works), and nothing it asks for happens (no code runs, no file outside the
data set is read)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from helpers import EVAL_SET, REPO, copy_model
from hostile_harness import MAX_SECONDS, CachedBuild, refused


Case = Callable[[Path, Path], tuple[list[str], list[str]]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def deco(fn: Case) -> Case:
        CASES[name] = fn
        return fn
    return deco


def _recipe(tmp: Path, body: str = "", eval_set: Path | None = None, model: Path | None = None) -> Path:
    text = (f"extends: {REPO / 'recipes' / 'cpu-fp32.yaml'}\nname: hostile\n"
            + (f"model: {model}\n" if model else "")
            + f"validation:\n  eval_set: {eval_set or EVAL_SET}\n  max_items: 1\n" + body)
    p = tmp / "hostile.yaml"
    p.write_text(text)
    return p


def _eval_set(tmp: Path, **fields: object) -> Path:
    """A one-line eval set whose line is the first shipped item with ``fields`` replaced."""
    root = tmp / "eval"
    shutil.copytree(EVAL_SET / "prompts", root / "prompts")
    row = json.loads((EVAL_SET / "manifest.jsonl").read_text().splitlines()[0]) | fields
    (root / "manifest.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n")
    return root


def _build(tmp: Path, **fields: object) -> list[str]:
    return ["build", str(_recipe(tmp, eval_set=_eval_set(tmp, **fields)))]


# ---- recipes -------------------------------------------------------------------------------------

@case("yaml-alias-bomb")
def _bomb(tmp, model):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    p = tmp / "bomb.yaml"
    p.write_text("name: bomb\n" + "\n".join(lines) + "\n")
    return ["build", str(p)], ["bomb.yaml", "expands to more than"]


@case("yaml-deep-nesting")
def _deep(tmp, model):
    p = tmp / "deep.yaml"
    p.write_text("name: deep\nx: " + "[" * 20000 + "]" * 20000 + "\n")
    return ["build", str(p)], ["deep.yaml", "nested more than"]


@case("yaml-python-tag")
def _tag(tmp, model):
    marker = tmp / "pwned"
    p = tmp / "tag.yaml"
    p.write_text(f"name: t\nstages: !!python/object/apply:os.system ['touch {marker}']\n")
    return ["build", str(p)], ["tag.yaml:2", "stages", "YAML tag"]


@case("yaml-custom-tag")
def _tag2(tmp, model):
    return ["build", str(_recipe(tmp, "stages:\n  llm:\n    export: {opset: !env OPSET}\n"))], \
        ["hostile.yaml:8", "stages.llm.export.opset", "YAML tag '!env'"]


@case("recipe-huge-file")
def _huge(tmp, model):
    p = tmp / "huge.yaml"
    p.write_text("name: huge\n" + "# padding\n" * 200_000)
    return ["build", str(p)], ["huge.yaml", "over the", "byte limit"]


@case("recipe-not-utf8")
def _latin1(tmp, model):
    p = tmp / "latin1.yaml"
    p.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    return ["build", str(p)], ["latin1.yaml", "not UTF-8"]


@case("recipe-nan-threshold")
def _nan(tmp, model):
    return ["build", str(_recipe(tmp, "  gate:\n    min: {llm.logit_cosine: .nan}\n"))], \
        ["hostile.yaml:7", "llm.logit_cosine", "NaN"]


@case("recipe-extends-system-file")
def _extends(tmp, model):
    p = tmp / "ext.yaml"
    p.write_text("extends: ../../../../../../../../etc/passwd\nname: e\n")
    return ["build", str(p)], ["/etc/passwd"]


@case("recipe-extends-dev-zero")
def _extends_zero(tmp, model):
    p = tmp / "ext.yaml"
    p.write_text("extends: /dev/zero\nname: e\n")  # stat says 0 bytes; reading never ends
    return ["build", str(p)], ["/dev/zero", "character device", "not a regular file"]


@case("recipe-extends-fifo")
def _extends_fifo(tmp, model):
    os.mkfifo(tmp / "pipe.yaml")  # opening it would wait for a writer forever
    p = tmp / "ext.yaml"
    p.write_text(f"extends: {tmp / 'pipe.yaml'}\nname: e\n")
    return ["build", str(p)], ["pipe.yaml", "FIFO"]


@case("cv1-llm-on-a-checkpoint-backend")
def _cv1_checkpoint(tmp, model):
    # TensorRT-LLM serves a Qwen2 checkpoint; CosyVoice-300M's LM has none. Refused at plan time, not
    # after the model and reference steps when its checkpoint export fails.
    p = tmp / "cv1-trtllm.yaml"
    p.write_text(f"extends: {REPO / 'recipes' / 'l20-int8.yaml'}\nname: cv1-trtllm\nmodel: builtin:cv1-tiny\n")
    return ["build", str(p)], ["cv1-trtllm.yaml", "stages.llm.engine.backend 'trtllm'", "not a Qwen2 body"]


@case("text-file-dev-zero")
def _text_zero(tmp, model):
    # refused by type before it is opened (stat says 0 bytes; reading never ends)
    return ["synthesize", str(tmp / "bundle"), "--text-file", "/dev/zero", "--out", str(tmp / "o.wav")], \
        ["/dev/zero: is a character device, not a regular file"]


@case("eval-manifest-is-a-fifo")
def _manifest_fifo(tmp, model):
    args = _build(tmp)
    (tmp / "eval" / "manifest.jsonl").unlink()
    os.mkfifo(tmp / "eval" / "manifest.jsonl")
    return args, ["manifest.jsonl", "FIFO"]


@case("gate-baseline-missing")
def _baseline_missing(tmp, model):
    p = _recipe(tmp, body="  gate: {baseline: no-such-report.json}\n")
    return ["build", str(p)], ["no-such-report.json", "no report.json"]


@case("gate-baseline-not-json")
def _baseline_bad(tmp, model):
    (tmp / "base.json").write_text('{"checks": ')
    p = _recipe(tmp, body="  gate: {baseline: base.json}\n")
    return ["build", str(p)], ["base.json", "not valid JSON"]


@case("recipe-control-character")
def _control(tmp, model):
    p = tmp / "ctl.yaml"
    p.write_text("name: a\x1fb\n")
    return ["build", str(p)], ["ctl.yaml", "malformed YAML", "special characters are not allowed"]


@case("recipe-nul-byte")
def _nul(tmp, model):
    p = tmp / "nul.yaml"
    p.write_bytes(b"name: x\nmodel: builtin:tiny\x00\n")
    return ["build", str(p)], ["nul.yaml", "malformed YAML"]


@case("recipe-name-is-a-path")
def _name(tmp, model):
    p = tmp / "name.yaml"
    p.write_text(f"extends: {REPO / 'recipes' / 'cpu-fp32.yaml'}\nname: ../../outside\n")
    return ["build", str(p)], ["name.yaml:2", "name"]


# ---- data sets -----------------------------------------------------------------------------------

@case("prompt-wav-dotdot")
def _dotdot(tmp, model):
    return _build(tmp, prompt_wav="../../../../../../etc/passwd"), ["manifest.jsonl:1", "prompt_wav", "outside"]


@case("prompt-wav-absolute")
def _absolute(tmp, model):
    return _build(tmp, prompt_wav="/etc/passwd"), ["manifest.jsonl:1", "prompt_wav", "relative"]


@case("prompt-wav-symlink-out")
def _link(tmp, model):
    args = _build(tmp)
    os.symlink("/etc/passwd", tmp / "eval" / "prompts" / "link.wav")
    row = json.loads((tmp / "eval" / "manifest.jsonl").read_text()) | {"prompt_wav": "prompts/link.wav"}
    (tmp / "eval" / "manifest.jsonl").write_text(json.dumps(row) + "\n")
    return args, ["manifest.jsonl:1", "prompts/link.wav", "outside"]


@case("prompt-wav-not-audio")
def _notaudio(tmp, model):
    args = _build(tmp)
    (tmp / "eval" / "prompts" / "eval-prompt-00.wav").write_text("this is text, not RIFF audio\n")
    return args, ["eval-prompt-00.wav", "unreadable audio"]


@case("prompt-wav-too-long")
def _long_wav(tmp, model):
    import soundfile as sf

    args = _build(tmp)
    sf.write(str(tmp / "eval" / "prompts" / "eval-prompt-00.wav"), np.zeros(16000 * 31, np.float32), 16000)
    return args, ["eval-prompt-00.wav", "31.0 s", "up to 30 s"]


@case("prompt-wav-nan-samples")
def _nan_prompt(tmp, model):
    import soundfile as sf

    args = _build(tmp)
    wav = np.full(16000, 0.1, np.float32)
    wav[100] = np.nan  # a float WAV stores NaN as it is
    sf.write(str(tmp / "eval" / "prompts" / "eval-prompt-00.wav"), wav, 16000, subtype="FLOAT")
    return args, ["eval-prompt-00.wav", "NaN or Inf"]


@case("prompt-flac-too-long")
def _long_flac(tmp, model):
    import soundfile as sf

    args = _build(tmp, prompt_wav="prompts/long.flac")
    sf.write(str(tmp / "eval" / "prompts" / "long.flac"), np.zeros(16000 * 31, np.float32), 16000)
    return args, ["long.flac", "31.0 s", "up to 30 s"]


@case("prompt-wav-1-hz")
def _one_hz(tmp, model):
    import soundfile as sf

    args = _build(tmp)
    sf.write(str(tmp / "eval" / "prompts" / "eval-prompt-00.wav"), np.zeros(20, np.float32), 1)
    return args, ["eval-prompt-00.wav", "1 Hz", "8-192 kHz"]


@case("prompt-text-10000-chars")
def _long_prompt_text(tmp, model):
    # Used to reach the LM's prefix whole: 3 GB of attention for one item.
    return _build(tmp, prompt_text="a prompt that goes on " * 455), ["manifest.jsonl:1", "'prompt_text'", "at most 400"]


@case("text-whitespace-only")
def _ws(tmp, model):
    return _build(tmp, text=" \t \u3000 "), ["manifest.jsonl:1", "nothing to speak"]


@case("text-emoji-only")
def _emoji(tmp, model):
    return _build(tmp, text="\U0001F600\U0001F389\U0001F44D !!"), ["manifest.jsonl:1", "nothing to speak"]


@case("text-empty")
def _empty(tmp, model):
    return _build(tmp, text=""), ["manifest.jsonl:1", "non-empty string fields"]


@case("manifest-duplicate-ids")
def _dup(tmp, model):
    args = _build(tmp)
    line = (tmp / "eval" / "manifest.jsonl").read_text()
    (tmp / "eval" / "manifest.jsonl").write_text(line + line)
    return args, ["manifest.jsonl:2", "duplicate id"]


@case("manifest-id-is-a-path")
def _idpath(tmp, model):
    return _build(tmp, id="../../escape"), ["manifest.jsonl:1", "id '../../escape'"]


@case("manifest-not-utf8")
def _mlatin(tmp, model):
    args = _build(tmp)
    (tmp / "eval" / "manifest.jsonl").write_bytes(b'{"id": "a", "text": "caf\xe9"}\n')
    return args, ["manifest.jsonl", "not UTF-8"]


@case("manifest-deep-json")
def _mdeep(tmp, model):
    args = _build(tmp)
    (tmp / "eval" / "manifest.jsonl").write_text('{"id": "a", "text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return args, ["manifest.jsonl:1", "not valid JSON"]


@case("manifest-field-types")
def _types(tmp, model):
    return _build(tmp, prompt_text=float("nan")), ["manifest.jsonl:1", "'prompt_text' must be a string"]


# ---- model dirs ----------------------------------------------------------------------------------

@case("checkpoint-pickle-with-code")
def _pickle(tmp, model):
    import pickle

    marker = tmp / "pwned"

    class Evil:
        def __reduce__(self):  # runs os.system on unpickling, if anything unpickles it unsafely
            return (os.system, (f"touch {marker}",))

    (model / "flow.pt").write_bytes(pickle.dumps({"w": Evil()}))
    return ["build", str(_recipe(tmp, model=model))], ["flow.pt"]


def _edit_first_float(path: Path, edit: Callable) -> str:
    """Apply ``edit`` to the first floating tensor of a checkpoint in place; returns its key."""
    import torch

    sd = torch.load(path, weights_only=True)
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.numel() > 1)
    sd[key] = edit(sd[key])
    torch.save(sd, path)
    return key


@case("checkpoint-nan-weight")
def _nan_weight(tmp, model):
    def poison(t):
        t = t.clone()
        t.view(-1)[0] = float("nan")
        return t

    key = _edit_first_float(model / "flow.pt", poison)
    return ["build", str(_recipe(tmp, model=model))], ["flow.pt", key, "NaN or Inf"]


@case("checkpoint-int-truncated-weight")
def _int_weight(tmp, model):
    key = _edit_first_float(model / "llm.pt", lambda t: t.to(__import__("torch").int32))
    return ["build", str(_recipe(tmp, model=model))], ["llm.pt", key, "is int32", "float32"]


@case("model-config-200000-layers")
def _many_layers(tmp, model):
    cfg = model / "CosyVoice-BlankEN" / "config.json"
    body = json.loads(cfg.read_text()) | {"num_hidden_layers": 200_000}
    cfg.write_text(json.dumps(body))
    return ["build", str(_recipe(tmp, model=model))], ["config.json", "num_hidden_layers: 200000", "outside 1..512"]


@case("model-config-zero-heads")
def _zero_heads(tmp, model):
    cfg = model / "cosyvoice2.yaml"
    text = cfg.read_text()
    assert "attention_heads: 2" in text
    cfg.write_text(text.replace("attention_heads: 2", "attention_heads: 0", 1))
    return ["build", str(_recipe(tmp, model=model))], ["cosyvoice2.yaml", "attention_heads: 0", "outside 1..512"]


@case("checkpoint-symlink-to-device")
def _dev(tmp, model):
    (model / "hift.pt").unlink()
    os.symlink("/dev/zero", model / "hift.pt")
    return ["build", str(_recipe(tmp, model=model))], ["hift.pt", "not a file"]


@case("frontend-corrupt-onnx")
def _onnx(tmp, model):
    data = (model / "campplus.onnx").read_bytes()
    (model / "campplus.onnx").write_bytes(data[: len(data) // 3])
    return ["build", str(_recipe(tmp, model=model))], ["campplus.onnx"]


@case("model-config-alias-bomb")
def _cfg_bomb(tmp, model):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    with (model / "cosyvoice2.yaml").open("a") as f:
        f.write("\n" + "\n".join(lines) + "\n")
    return ["build", str(_recipe(tmp, model=model))], ["cosyvoice2.yaml", "expands to more than"]


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name: str, tmp_path: Path, tiny_model_dir: Path, followup: CachedBuild) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "model")
    args, expected = CASES[name](tmp_path, model)
    refused(args, *expected, cwd=tmp_path, followup=followup)
    assert not (tmp_path / "pwned").exists(), "input code ran"


def test_enough_cases() -> None:
    assert len(CASES) >= 18


def test_long_text_is_split_into_bounded_items(tmp_path: Path) -> None:
    """A 2,000-character text becomes several items cut at sentence ends, each under the bound."""
    from cosycompile.runtime.dataset import MAX_ITEM_WEIGHT, PIECE_WEIGHT, load_dataset
    from cosycompile.runtime.text import text_weight

    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
    text = (sentence * 30)[:2000]
    root = _eval_set(tmp_path, text=text)
    items = load_dataset(root).items
    assert len(items) >= 2000 // PIECE_WEIGHT and all(text_weight(i.text) <= PIECE_WEIGHT for i in items)
    assert [i.id for i in items] == [f"eval-en-0001.part{k}" for k in range(1, len(items) + 1)]
    assert " ".join(i.text for i in items) == " ".join(text.split())
    assert all(i.text.endswith(".") for i in items[:-1])  # cut at sentence ends
    short = load_dataset(EVAL_SET).items  # the shipped sets are under the bound: unchanged
    assert all(text_weight(i.text) <= MAX_ITEM_WEIGHT and ".part" not in i.id for i in short)


def test_a_megabyte_without_a_sentence_end_splits_within_the_bound() -> None:
    """The largest --text-file (1 MiB) as one unbroken CJK run: split within the hostile bound
    (cutting it used to re-weigh and re-slice the rest per piece: minutes)."""
    from cosycompile.runtime.text import split_text, text_weight

    text = "这是一个测试" * (1_000_000 // 6)
    t0 = time.perf_counter()
    pieces = split_text(text, 80)
    assert time.perf_counter() - t0 < MAX_SECONDS
    assert "".join(pieces) == text and all(text_weight(p) <= 80 for p in pieces)


def test_a_bad_claim_ttl_is_refused_before_any_work(tmp_path: Path, followup: CachedBuild) -> None:
    # Read when the remote cache is opened: at the first claim, a failure would only be a warning.
    env = {**os.environ, "COSYCOMPILE_CLAIM_TTL_S": "abc"}
    args = ["build", str(_recipe(tmp_path)), "--cache-remote", (tmp_path / "remote").as_uri()]
    refused(args, "$COSYCOMPILE_CLAIM_TTL_S='abc'", "2 to 3600", cwd=tmp_path, followup=followup, env=env)
    assert not (tmp_path / "remote").exists()
