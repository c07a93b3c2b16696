"""The bundle: ``builds/<name>-<key12>/`` with engines, manifest, report and audio, published atomically."""

from __future__ import annotations

from cosycompile.exporters import ExporterInfo

PLUGIN = ExporterInfo(summary="engines + manifest.json + report (builds/<name>-<key12>/)")
