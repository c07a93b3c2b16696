"""The LLM's HF rewrite (speech tokens in a Qwen2 vocabulary), checked against the PyTorch Qwen2LM:
raw logits over the speech + stop ids, greedy decoding through ``generate``, bf16, and the ModelOpt
quantized exports. Real models and real transformers loads; nothing is mocked."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from cosycompile.families.cosyvoice2.loader import init_model, load_models
from cosycompile.stages.llm.hf_rewrite import (MODELING_FILE, PREFIX_FILE, TOKEN_MAP_FILE, padded_vocab, token_map,
                                              write_hf_rewrite)
from helpers import cv3_network_greedy

TEXT = [5, 77, 300, 12, 9, 40, 101]
PROMPT_TEXT = [33, 44]
PROMPT_SPEECH = [10, 200, 6000, 3]


def _reference(lm, text, prompt_text=None, prompt_speech=None):
    """Qwen2LM's speech-head logits [S, S_tokens+3] over the prompt (eager attention, FP32)."""
    t = torch.tensor([text])
    pt = torch.tensor([prompt_text]) if prompt_text else None
    ps = torch.tensor([prompt_speech]) if prompt_speech else None
    with torch.no_grad():
        emb = lm.prompt_embeddings(t, pt, ps)
        h = lm.qwen(inputs_embeds=emb, output_hidden_states=True).hidden_states[-1]
        return lm.llm_decoder(h)[0]


def _load(out: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()


def _logits_by_ids_and_embeds(hf, out: Path, tmap, text: list[int], prompt_speech: list[int]):
    """The rewrite's logits of ``[sos | text | task_id | prompt speech]`` given as ids, and the same prompt
    from the prefix embeddings file (what a server with inputs_embeds would build)."""
    from safetensors.torch import load_file

    ids = torch.tensor([tmap.prompt_ids(text, prompt_speech)])
    with torch.no_grad():
        logits = hf(input_ids=ids).logits[0]
        pre = load_file(str(out / PREFIX_FILE))
        emb = hf.model.embed_tokens(ids)[0]
        emb[0], emb[len(text) + 1] = pre["sos"], pre["task_id"]
        return logits, hf(inputs_embeds=emb[None]).logits[0]


def _greedy_hf(hf, tmap, text, prompt_text, prompt_speech, max_tokens):
    """CosyVoice2's greedy decoding through ``generate``: only eos1 is masked before min_len
    (upstream masks the end token alone), and any of the three stop ids ends the sequence."""
    from transformers import LogitsProcessorList, MinNewTokensLengthLogitsProcessor

    ids = torch.tensor([tmap.prompt_ids(prompt_text + text, prompt_speech)])
    min_len = int(len(text) * tmap.min_token_text_ratio)
    max_len = min(int(len(text) * tmap.max_token_text_ratio), max_tokens)
    procs = LogitsProcessorList([MinNewTokensLengthLogitsProcessor(ids.shape[1], min_len, [tmap.stop_ids[0]])])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_len, do_sample=False,
                      logits_processor=procs, eos_token_id=tmap.stop_ids, pad_token_id=tmap.stop_ids[0])
    new = out[0, ids.shape[1]:].tolist()
    tokens = []
    for t in new:
        if t in tmap.stop_ids:
            break
        tokens.append(t - tmap.text_vocab)
    return tokens


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    models = load_models(tiny_model_dir, ("llm",))
    out = tmp_path_factory.mktemp("rewrite") / "hf"
    meta = write_hf_rewrite(copy.deepcopy(models.llm), models.config, tiny_model_dir, out, "float32")
    return models, out, meta


def test_layout_and_token_map(tiny) -> None:
    models, out, meta = tiny
    cfg = json.loads((out / "config.json").read_text())
    tmap = token_map(models.config, None, "cosyvoice2")
    # builtin:tiny: the stand-in tokenizer spans the config's 512 ids, then 6561 speech + 3 stop + sos + task_id.
    assert tmap.text_vocab == 512 and tmap.vocab_size == padded_vocab(512 + 6566) == 7168
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["vocab_size"] == 7168
    assert cfg["tie_word_embeddings"] is False and cfg["eos_token_id"] == [7073, 7074, 7075]
    assert cfg["auto_map"]["AutoModelForCausalLM"].startswith(MODELING_FILE[:-3])
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tmap.stop_ids and gen["top_k"] == 25 and gen["top_p"] == 0.8
    body = json.loads((out / TOKEN_MAP_FILE).read_text())
    assert body["token_map"]["sos_id"] == 7076 and body["token_map"]["task_id_id"] == 7077
    assert body["token_map"]["speech_ids"] == [512, 512 + 6564]
    from safetensors.torch import load_file

    prefix = load_file(str(out / PREFIX_FILE))
    assert torch.equal(prefix["sos"], models.llm.llm_embedding.weight[0].detach())
    assert torch.equal(prefix["task_id"], models.llm.llm_embedding.weight[1].detach())
    w = load_file(str(out / "model.safetensors"))
    assert torch.isinf(w["lm_head.bias"]).sum().item() == 7168 - 6564  # -inf everywhere but speech + stop


def test_logits_match_qwen2lm_fp32(tiny) -> None:
    """Raw logits over the 6564 speech + stop ids vs ``llm_decoder``'s, prompt as ids and as embeddings."""
    models, out, _ = tiny
    lm, tmap = models.llm, token_map(models.config, None, "cosyvoice2")
    ref = _reference(lm, TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    hf = _load(out)
    T, n = tmap.text_vocab, tmap.speech_token_size + 3
    logits, logits_e = _logits_by_ids_and_embeds(hf, out, tmap, PROMPT_TEXT + TEXT, PROMPT_SPEECH)
    err = (logits[:, T:T + n] - ref).abs().max().item()
    err_e = (logits_e[:, T:T + n] - ref).abs().max().item()
    print(f"builtin:tiny fp32 max abs logit error: ids {err:.3g}, inputs_embeds {err_e:.3g}")
    assert err < 1e-3 and err_e < 1e-3
    assert torch.isneginf(logits[:, :T]).all() and torch.isneginf(logits[:, T + n:]).all()


def test_greedy_generate_matches_reference(tiny) -> None:
    models, out, _ = tiny
    tmap = token_map(models.config, None, "cosyvoice2")
    ref = models.llm.inference(torch.tensor([TEXT]), torch.tensor([PROMPT_TEXT]), torch.tensor([PROMPT_SPEECH]),
                               sampling="greedy", max_tokens=40)
    got = _greedy_hf(_load(out), tmap, TEXT, PROMPT_TEXT, PROMPT_SPEECH, 40)
    assert len(ref) > 0 and got == ref


def test_stock_qwen2_drops_the_head_bias(tiny) -> None:
    """Why the dir ships its modeling file: plain Qwen2ForCausalLM (as TRT-LLM / vLLM load it) has no
    lm_head bias, so its logits lack llm_decoder's bias and text ids score 0, not -inf."""
    from transformers import Qwen2ForCausalLM

    models, out, _ = tiny
    tmap = token_map(models.config, None, "cosyvoice2")
    stock = Qwen2ForCausalLM.from_pretrained(str(out)).eval()
    assert stock.lm_head.bias is None
    ids = torch.tensor([tmap.prompt_ids(TEXT)])
    with torch.no_grad():
        logits = stock(input_ids=ids).logits[0]
    ref = _reference(models.llm, TEXT)
    T, n = tmap.text_vocab, tmap.speech_token_size + 3
    assert (logits[:, T:T + n] - ref).abs().max().item() > 1e-3
    assert (logits[:, :T] == 0).all()


def test_bf16_keeps_inf_bias(tiny, tmp_path: Path, tiny_model_dir: Path) -> None:
    """bf16 stores -inf (no finite stand-in needed); logits stay close and log-softmax has no NaN."""
    models, _, _ = tiny
    out = tmp_path / "bf16"
    meta = write_hf_rewrite(copy.deepcopy(models.llm), models.config, tiny_model_dir, out, "bfloat16")
    assert meta["dtype"] == "bfloat16"
    from safetensors.torch import load_file

    w = load_file(str(out / "model.safetensors"))
    assert w["lm_head.bias"].dtype == torch.bfloat16 and torch.isneginf(w["lm_head.bias"]).sum().item() == 7168 - 6564
    tmap = token_map(models.config, None, "cosyvoice2")
    hf = _load(out)
    ids = torch.tensor([tmap.prompt_ids(TEXT)])
    with torch.no_grad():
        logits = hf(input_ids=ids).logits[0].float()
    T, n = tmap.text_vocab, tmap.speech_token_size + 3
    assert not torch.isnan(logits.log_softmax(-1)).any()
    err = (logits[:, T:T + n] - _reference(models.llm, TEXT)).abs().max().item()
    print(f"builtin:tiny bf16 max abs logit error: {err:.3g}")
    assert err < 0.1


@pytest.mark.parametrize("fmt, algo, weight_dtype", [("int8_sq", "W8A8_SQ_PER_CHANNEL", "I8"),
                                                     ("int4_awq", "W4A16_AWQ", "U8")])
def test_quantized_export(fmt: str, algo: str, weight_dtype: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """ModelOpt-quantized LM -> unified HF export of the rewrite: quantization_config names the
    algorithm, lm_head is excluded and keeps the speech head with its bias."""
    import modelopt.torch.quantization as mtq
    from safetensors import safe_open

    from cosycompile.quantize.modelopt_torch.quantize import _export_hf, quant_config

    models = load_models(tiny_model_dir, ("llm",))
    lm = models.llm
    torch.manual_seed(0)
    records = [lm.prompt_embeddings(torch.randint(0, 512, (1, 12))) for _ in range(4)]

    def loop(_):
        with torch.no_grad():
            for r in records:
                lm.qwen.model(inputs_embeds=r)

    p = {"format": fmt, "method": "awq_lite" if fmt == "int4_awq" else "max", "alpha": 0.5, "block_size": 128}
    mtq.quantize(lm.qwen, quant_config(p), loop)
    out = tmp_path / "hf"
    meta = _export_hf(copy.deepcopy(lm), models.config, tiny_model_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == algo == meta["quantization_config"]["quant_algo"]
    assert cfg["quantization_config"]["quant_method"] == "modelopt" and "lm_head" in cfg["quantization_config"]["ignore"]
    hq = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == algo and "lm_head" in hq["exclude_modules"]
    assert cfg["vocab_size"] == 7168 and cfg["auto_map"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        q = "model.layers.0.self_attn.q_proj"
        assert str(f.get_slice(f"{q}.weight").get_dtype()) == weight_dtype and f"{q}.weight_scale" in keys
        assert f.get_slice("lm_head.weight").get_shape() == [7168, 128] and "lm_head.weight_scale" not in keys
        bias = f.get_tensor("lm_head.bias")
        head_w = f.get_tensor("lm_head.weight")
    assert torch.equal(bias[512:512 + 6564], lm.llm_decoder.bias.detach())
    assert torch.equal(head_w[512:512 + 6564], lm.llm_decoder.weight.detach())
    assert (out / TOKEN_MAP_FILE).is_file() and (out / MODELING_FILE).is_file()


@pytest.mark.slow
@pytest.mark.model05b
def test_random_05b_logits_and_greedy(tmp_path: Path) -> None:
    """The full-size body (0.5B, vocab 151,936 + 6,566 -> 158,592): a few tokens only."""
    model_dir = init_model("builtin:random-0.5b", tmp_path / "model")
    models = load_models(model_dir, ("llm",))
    tmap = token_map(models.config, None, "cosyvoice2")
    assert tmap.text_vocab == 151936 and tmap.vocab_size == 158592
    text = TEXT[:4]
    ref_logits = _reference(models.llm, text)
    ref_tokens = models.llm.inference(torch.tensor([text]), sampling="greedy", max_tokens=6)
    out = tmp_path / "hf"
    write_hf_rewrite(models.llm, models.config, model_dir, out, "float32")  # in place: the LM is done with
    del models
    hf = _load(out)
    T, n = tmap.text_vocab, tmap.speech_token_size + 3
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([tmap.prompt_ids(text)])).logits[0]
    err = (logits[:, T:T + n] - ref_logits).abs().max().item()
    print(f"builtin:random-0.5b fp32 max abs logit error: {err:.3g}")
    assert err < 1e-3
    assert _greedy_hf(hf, tmap, text, [], [], 6) == ref_tokens


# CosyVoice3: no llm_embedding (sos = S, task_id = S+2 are speech-embedding rows), S+200 head rows
# without a bias, every id from S on stops. builtin:cv3-tiny: 256 text ids, S = 64.
CV3_TEXT = [5, 77, 200, 12, 9, 40, 101, 3]
CV3_PROMPT_TEXT = [33, 44]
CV3_PROMPT_SPEECH = [10, 20, 63, 3]


def _cv3_reference(lm, text, prompt_text=None, prompt_speech=None):
    """CosyVoice3LM's speech-head logits [S, S_tokens+200] over the prompt (eager attention, FP32)."""
    with torch.no_grad():
        emb = lm.prompt_embeddings(torch.tensor([text]), torch.tensor([prompt_text]) if prompt_text else None,
                                   torch.tensor([prompt_speech]) if prompt_speech else None)
        return lm.step(emb)[0][0]


@pytest.fixture(scope="module")
def cv3(tmp_path_factory: pytest.TempPathFactory):
    from cosycompile.families.cosyvoice3.loader import init_model as cv3_init, load_models as cv3_load

    model_dir = cv3_init("builtin:cv3-tiny", tmp_path_factory.mktemp("cv3") / "model")
    models = cv3_load(model_dir, ("llm",))
    out = model_dir.parent / "hf"
    meta = write_hf_rewrite(copy.deepcopy(models.llm), models.config, model_dir, out, "float32")
    return models, out, meta, model_dir


def test_cv3_layout_and_token_map(cv3) -> None:
    models, out, meta, _ = cv3
    tmap = token_map(models.config, None, "cosyvoice3")
    S = models.config.lm.speech_token_size
    assert (tmap.text_vocab, S, tmap.rows, tmap.head_rows) == (256, 64, 264, 264)
    assert tmap.vocab_size == padded_vocab(256 + 264) == 640 and tmap.family == "cosyvoice3"
    # sos and task_id are speech-vocabulary ids (rows S and S+2), not ids appended after it.
    assert (tmap.sos_id, tmap.task_id_id, tmap.eos_id) == (256 + 64, 256 + 66, 256 + 64)
    assert tmap.stop_ids == list(range(256 + 64, 256 + 264)) and len(tmap.stop_ids) == 200
    assert meta["token_map"] == tmap.as_json()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 640 and cfg["tie_word_embeddings"] is False and cfg["eos_token_id"] == tmap.stop_ids
    assert cfg["bos_token_id"] == tmap.sos_id and cfg["auto_map"]["AutoModelForCausalLM"].startswith(MODELING_FILE[:-3])
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tmap.stop_ids and gen["top_k"] == 25 and gen["top_p"] == 0.8
    body = json.loads((out / TOKEN_MAP_FILE).read_text())
    assert body["format"] == "cosyvoice3-hf-rewrite" and body["token_map"]["speech_ids"] == [256, 256 + 264]
    names = tmap.token_names()
    assert names[S:S + 4] == ["<|sos|>", "<|eos1|>", "<|task_id|>", "<|fill|>"] and names[S + 4] == f"<|s_{S + 4}|>"
    from safetensors.torch import load_file

    lm = models.llm
    prefix = load_file(str(out / PREFIX_FILE))
    assert torch.equal(prefix["sos"], lm.speech_embedding.weight[lm.sos].detach())
    assert torch.equal(prefix["task_id"], lm.speech_embedding.weight[lm.task_id].detach())
    w = load_file(str(out / "model.safetensors"))
    # Every one of the 200 stop ids: its embedding and head rows are the speech tables' rows, bias 0.
    assert torch.equal(w["model.embed_tokens.weight"][256:256 + 264], lm.speech_embedding.weight.detach())
    assert torch.equal(w["lm_head.weight"][256:256 + 264], lm.llm_decoder.weight.detach())
    assert (w["lm_head.bias"][256:256 + 264] == 0).all() and torch.isneginf(w["lm_head.bias"]).sum().item() == 640 - 264
    assert torch.equal(w["model.embed_tokens.weight"][:256], lm.qwen.model.embed_tokens.weight.detach())


def test_cv3_logits_match_lm_fp32(cv3) -> None:
    """Raw logits over the 264 speech + stop ids vs ``llm_decoder``'s, prompt as ids and as embeddings."""
    models, out, _, _ = cv3
    lm, tmap = models.llm, token_map(models.config, None, "cosyvoice3")
    ref = _cv3_reference(lm, CV3_TEXT, CV3_PROMPT_TEXT, CV3_PROMPT_SPEECH)
    hf = _load(out)
    T, n = tmap.text_vocab, tmap.head_rows
    logits, logits_e = _logits_by_ids_and_embeds(hf, out, tmap, CV3_PROMPT_TEXT + CV3_TEXT, CV3_PROMPT_SPEECH)
    err = (logits[:, T:T + n] - ref).abs().max().item()
    err_e = (logits_e[:, T:T + n] - ref).abs().max().item()
    print(f"builtin:cv3-tiny fp32 max abs logit error: ids {err:.3g}, inputs_embeds {err_e:.3g}")
    assert err < 1e-3 and err_e < 1e-3
    assert torch.isneginf(logits[:, :T]).all() and torch.isneginf(logits[:, T + n:]).all()


def test_cv3_greedy_generate_matches_reference(cv3) -> None:
    models, out, _, _ = cv3
    tmap = token_map(models.config, None, "cosyvoice3")
    ref = cv3_network_greedy(models.llm, CV3_TEXT, CV3_PROMPT_TEXT, CV3_PROMPT_SPEECH, 40)
    got = _greedy_hf(_load(out), tmap, CV3_TEXT, CV3_PROMPT_TEXT, CV3_PROMPT_SPEECH, 40)
    assert len(ref) > 0 and got == ref


def test_cv3_every_stop_id_ends_generate(cv3) -> None:
    """Each of the 200 ids from S on, forced as the first new token, ends ``generate`` with the saved
    generation config (no eos passed in), and only those ids do: the speech id before them does not."""
    from transformers import LogitsProcessor, LogitsProcessorList

    models, out, _, _ = cv3
    tmap = token_map(models.config, None, "cosyvoice3")
    hf = _load(out)

    class Force(LogitsProcessor):
        def __init__(self, token: int) -> None:
            self.token = token

        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.token] = 0.0
            return forced

    ids = torch.tensor([tmap.prompt_ids(CV3_TEXT)])
    ended = []
    for token in [tmap.speech_id(tmap.speech_token_size - 1), *tmap.stop_ids]:
        res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                          logits_processor=LogitsProcessorList([Force(token)]))
        ended.append(res.shape[1] - ids.shape[1] == 1)
    assert ended == [False] + [True] * 200


def test_cv3_bf16_and_detected_family(cv3, tmp_path: Path) -> None:
    """bf16 keeps the -inf bias; with no family named, the model dir's config file picks CosyVoice3."""
    models, _, _, model_dir = cv3
    out = tmp_path / "bf16"
    meta = write_hf_rewrite(copy.deepcopy(models.llm), models.config, model_dir, out, "bfloat16")
    assert meta["dtype"] == "bfloat16" and meta["token_map"]["family"] == "cosyvoice3"
    from safetensors.torch import load_file

    w = load_file(str(out / "model.safetensors"))
    assert w["lm_head.bias"].dtype == torch.bfloat16 and torch.isneginf(w["lm_head.bias"]).sum().item() == 640 - 264
    tmap = token_map(models.config, None, "cosyvoice3")
    with torch.no_grad():
        logits = _load(out)(input_ids=torch.tensor([tmap.prompt_ids(CV3_TEXT)])).logits[0].float()
    assert not torch.isnan(logits.log_softmax(-1)).any()
    err = (logits[:, 256:256 + 264] - _cv3_reference(models.llm, CV3_TEXT)).abs().max().item()
    print(f"builtin:cv3-tiny bf16 max abs logit error: {err:.3g}")
    assert err < 0.1


def test_cv3_quantized_export(cv3, tmp_path: Path) -> None:
    """ModelOpt INT8 SmoothQuant of CosyVoice3's LM -> unified HF export of its rewrite: lm_head
    excluded, holding the bias-free speech head (bias 0) over the 264 rows."""
    import modelopt.torch.quantization as mtq
    from safetensors import safe_open

    from cosycompile.quantize.modelopt_torch.quantize import _export_hf, quant_config

    models, _, _, model_dir = cv3
    lm = copy.deepcopy(models.llm)
    torch.manual_seed(0)
    records = [lm.prompt_embeddings(torch.randint(0, 256, (1, 12))) for _ in range(4)]

    def loop(_):
        with torch.no_grad():
            for r in records:
                lm.qwen.model(inputs_embeds=r)

    mtq.quantize(lm.qwen, quant_config({"format": "int8_sq", "method": "max", "alpha": 0.5, "block_size": 128}), loop)
    out = tmp_path / "hf"
    meta = _export_hf(copy.deepcopy(lm), models.config, model_dir, out, "cosyvoice3")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "W8A8_SQ_PER_CHANNEL" and "lm_head" in cfg["quantization_config"]["ignore"]
    assert cfg["vocab_size"] == 640 and meta["token_map"]["stop_ids"] == list(range(320, 520))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert str(f.get_slice("model.layers.0.self_attn.q_proj.weight").get_dtype()) == "I8"
        assert torch.equal(f.get_tensor("lm_head.weight")[256:520], lm.llm_decoder.weight.detach())
        bias = f.get_tensor("lm_head.bias")
    assert (bias[256:520] == 0).all() and torch.isneginf(bias[:256]).all() and torch.isneginf(bias[520:]).all()
