"""One metric registry: every figure a stage check, the pipeline check or the speed table reports,
with its direction and unit. Stage checks, the report, recipe thresholds and the gate all use it.

Stage metrics are declared by each stage plug-in; the pipeline and speed metrics are here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cosycompile.stages import Metric, pipeline_stages


@dataclass(frozen=True)
class RegisteredMetric:
    """A metric with its full name (``group.name``) and its path in ``report.json``."""

    full_name: str
    group: str
    metric: Metric
    path: tuple[str, ...]


PIPELINE_METRICS = (
    Metric("tokens_identical_ratio", "tokens_identical_ratio", True, "ratio", description="items with identical tokens"),
    Metric("mel_snr_db", "mel_snr_db_min", True, "dB", description="min mel SNR over items with identical tokens"),
    Metric("log_mel_l1", "log_mel_l1_mean", False, "", description="mean log-mel L1 distance"),
    # A hundredth of a dB of MCD is far below what anyone hears (differences under 1 dB are hard to).
    Metric("mcd_db", "mcd_db_mean", False, "dB", description="mel cepstral distortion (DTW)", resolution=0.01),
    Metric("speaker_similarity", "speaker_similarity_mean", True, "cosine", description="resemblyzer embedding cosine"),
    Metric("pesq", "pesq_mean", True, "MOS", description="PESQ wide-band"),
    Metric("stoi", "stoi_mean", True, "", description="short-time objective intelligibility"),
)
SPEED_METRICS = tuple(
    Metric(part, "speedup", True, "x", "speed", f"{part.replace('_', ' ')} speed-up over the FP32 reference")
    for part in (*pipeline_stages(), "end_to_end")
)


@lru_cache(maxsize=None)
def registry() -> dict[str, RegisteredMetric]:
    """Every metric by full name: ``<stage>.<name>``, ``pipeline.<name>``, ``speed.<part>``."""
    from cosycompile.stages import stage_infos

    out: dict[str, RegisteredMetric] = {}
    for stage in stage_infos().values():
        for m in stage.metrics:
            out[f"{stage.name}.{m.name}"] = RegisteredMetric(f"{stage.name}.{m.name}", stage.name, m,
                                                             ("checks", stage.name, "metrics", m.key))
    for m in PIPELINE_METRICS:
        out[f"pipeline.{m.name}"] = RegisteredMetric(f"pipeline.{m.name}", "pipeline", m,
                                                     ("checks", "pipeline", "metrics", m.key))
    for m in SPEED_METRICS:
        out[f"speed.{m.name}"] = RegisteredMetric(f"speed.{m.name}", "speed", m, ("speed", m.name, m.key))
    return out
