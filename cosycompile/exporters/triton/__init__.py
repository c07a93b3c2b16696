"""Triton Inference Server model repository of a bundle (``triton/<name>-<key12>/``, next to ``builds/``).

CPU bundles (every stage on ONNX Runtime) become python-backend models that run the bundle's
engines through :mod:`cosycompile.runtime`; GPU bundles (TensorRT flow/HiFT, TensorRT-LLM LM) become
the CosyVoice runtime's shape: a BLS ``cosyvoice2`` around ``token2wav``, ``vocoder``,
``speaker_embedding``, ``audio_tokenizer`` and a ``tensorrt_llm`` model or a ``trtllm-serve`` URL.
Also ``cosycompile triton BUNDLE --out DIR``.
"""

from __future__ import annotations

from cosycompile.exporters import ExporterInfo

PLUGIN = ExporterInfo(summary="Triton model repository of the bundle (triton/<name>-<key12>/)")
