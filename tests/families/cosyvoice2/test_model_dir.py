"""A model dir missing a file the build needs fails before any step runs: exit 2, one line naming the file,
nothing in the cache. And the tokenizer layouts the pre-flight accepts are exactly those the front end can use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from cosycompile.errors import DataError, ModelError
from cosycompile.families.cosyvoice2.layout import QWEN_DIR, check_model_dir
from helpers import copy_model, run_cli, write_recipe

TOKENIZER_CONFIG = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                    "unk_token": None, "bos_token": None, "model_max_length": 32768}


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE in the Qwen file formats: vocab.json, merges.txt, tokenizer.json, tokenizer_config.json."""
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["hello world, this is a test of the tokenizer"] * 8, vocab_size=300,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save_model(str(out))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return out


def _real_dir(tiny: Path, dst: Path, tokenizer: Path | None, files: tuple[str, ...]) -> Path:
    """The tiny model as a non-built-in dir: the front end then loads the Qwen tokenizer from ``files``."""
    model = copy_model(tiny, dst)
    (model / "builtin.json").unlink()
    for f in files:
        assert tokenizer is not None
        (model / QWEN_DIR / f).write_bytes((tokenizer / f).read_bytes())
    return model


def _assert_fails_before_any_step(model: Path, tmp: Path, needle: str) -> None:
    recipe = write_recipe(tmp / "r.yaml", {"name": "t", "model": str(model)})
    res = run_cli("build", str(recipe), "--artifacts", str(tmp / "art"), timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stderr[-2000:]}"
    assert "Traceback" not in res.stderr
    assert len(err.splitlines()) == 1 and err.startswith("cosycompile: error: "), err
    assert needle in err, (needle, err)
    objects = tmp / "art" / "cache" / "objects"
    assert not objects.exists() or not any(objects.iterdir())


@pytest.mark.parametrize("name", ["cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "campplus.onnx",
                                  "speech_tokenizer_v2.onnx", f"{QWEN_DIR}/config.json"])
def test_missing_file_fails_before_any_step(name: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "model")
    (model / name).unlink()
    # Without its config file a dir is no family's: the error says which config files it looked for.
    needle = f"{model}: holds no model config of a known family (one of: " if name == "cosyvoice2.yaml" \
        else f"{model / name}: missing"
    _assert_fails_before_any_step(model, tmp_path, needle)


def _write(name: str, content: str) -> Callable[[Path], None]:
    return lambda q: (q / name).write_text(content)


# (tokenizer files copied in, how one is broken, the file the error must name)
BROKEN_TOKENIZERS: dict[str, tuple[tuple[str, ...], Callable[[Path], None] | None, str]] = {
    # The reported bug: a real dir without tokenizer files tokenized every text to [].
    "no-tokenizer-files": ((), None, "vocab.json"),
    "only-tokenizer-config": (("tokenizer_config.json",), None, "vocab.json"),
    "no-merges": (("tokenizer_config.json", "vocab.json"), None, "merges.txt"),
    "empty-vocab": (("tokenizer_config.json", "vocab.json", "merges.txt"), _write("vocab.json", ""), "vocab.json"),
    "vocab-no-tokens": (("tokenizer_config.json", "vocab.json", "merges.txt"), _write("vocab.json", "{}"), "vocab.json"),
    "garbage-merges": (("tokenizer_config.json", "vocab.json", "merges.txt"), _write("merges.txt", "garbage{\n"),
                       "merges.txt"),
    "garbage-tokenizer-config": (("tokenizer_config.json", "vocab.json", "merges.txt"),
                                 _write("tokenizer_config.json", "garbage{"), "tokenizer_config.json"),
    "empty-tokenizer-json": (("tokenizer.json",), _write("tokenizer.json", ""), "tokenizer.json"),
}


@pytest.mark.parametrize("case", list(BROKEN_TOKENIZERS))
def test_broken_tokenizer_fails_before_any_step(case: str, tmp_path: Path, tiny_model_dir: Path,
                                                tokenizer_files: Path) -> None:
    files, breaker, named = BROKEN_TOKENIZERS[case]
    model = _real_dir(tiny_model_dir, tmp_path / "model", tokenizer_files, files)
    if breaker is not None:
        breaker(model / QWEN_DIR)
    _assert_fails_before_any_step(model, tmp_path, str(model / QWEN_DIR / named))


# Layouts of CosyVoice-BlankEN/ (config.json, model_type qwen2, is always there), and whether the front end works.
LAYOUTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "released-0.5b": (("tokenizer_config.json", "vocab.json", "merges.txt"), True),
    "tokenizer-json-only": (("tokenizer.json",), True),
    "vocab-merges-class-from-config": (("vocab.json", "merges.txt"), True),
    "all": (("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.json"), True),
    "none": ((), False),
    "vocab-only": (("tokenizer_config.json", "vocab.json"), False),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_preflight_accepts_exactly_what_the_frontend_can_use(layout: str, tmp_path: Path, tiny_model_dir: Path,
                                                             tokenizer_files: Path) -> None:
    from cosycompile.runtime.frontend import Frontend

    files, usable = LAYOUTS[layout]
    model = _real_dir(tiny_model_dir, tmp_path / "model", tokenizer_files, files)
    try:
        ids = Frontend(model).text_ids("hello world")
        works = ids.size > 0
    except ModelError:
        works = False
    assert works == usable
    if usable:
        check_model_dir(model, ["llm", "flow", "hift"])
    else:
        with pytest.raises(ModelError):
            check_model_dir(model, ["llm", "flow", "hift"])


def test_disabled_stage_checkpoint_not_needed_but_frontend_files_are(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "model")
    (model / "llm.pt").unlink()
    check_model_dir(model, ["flow", "hift"])
    (model / "speech_tokenizer_v2.onnx").write_bytes(b"")
    with pytest.raises(ModelError, match="speech_tokenizer_v2.onnx: empty"):
        check_model_dir(model, ["flow"])


def test_frontend_rejects_text_without_token_ids(tmp_path: Path, tiny_model_dir: Path) -> None:
    from cosycompile.runtime.frontend import Frontend

    builtin = Frontend(tiny_model_dir)
    assert builtin.text_ids("hi").size == 2
    for text in ("", " \n\t"):
        with pytest.raises(DataError, match="builtin.json: text to tokenize is empty or whitespace"):
            builtin.text_ids(text)
    # Tokenizer files that load but know no tokens (only the Qwen2 config): every text gives no ids.
    model = _real_dir(tiny_model_dir, tmp_path / "model", None, ())
    with pytest.raises(ModelError) as exc:
        Frontend(model).text_ids("a long sentence\nthat goes on and on and on past the limit")
    msg = str(exc.value)
    assert msg.startswith(f"{model / QWEN_DIR}: ") and "no token ids" in msg
    assert "'a long sentence\\nthat goes on and on and '..." in msg and "\n" not in msg


def test_standin_onnx_files_carry_the_oldest_ir_version_their_opset_allows(tiny_model_dir: Path) -> None:
    """The onnx package stamps its own IR version on a new model; a model dir written with a newer onnx
    than a server's ONNX Runtime would not load there. The stand-ins declare the oldest that holds them."""
    import onnx
    from onnx import helper

    for name in ("campplus.onnx", "speech_tokenizer_v2.onnx"):
        model = onnx.load(str(tiny_model_dir / name))
        assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import)), name
        assert model.ir_version < onnx.IR_VERSION, name


def test_front_end_model_this_runtime_cannot_read_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A front-end ONNX file stamped with an IR version newer than this ONNX Runtime reads (a model dir
    written on a machine with a newer onnx) names the file and the reason, not a runtime traceback."""
    import onnx

    from cosycompile.runtime.frontend import Frontend

    model = copy_model(tiny_model_dir, tmp_path / "model")
    campplus = onnx.load(str(model / "campplus.onnx"))
    campplus.ir_version = 99
    onnx.save(campplus, str(model / "campplus.onnx"))
    with pytest.raises(ModelError) as err:
        Frontend(model)
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{model / 'campplus.onnx'}: ONNX Runtime") and "IR version" in message, message
