"""cosycompile: reproducible, validated engine builds for CosyVoice2."""

__version__ = "0.1.0"
