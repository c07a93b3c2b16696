"""CosyVoice2's networks in PyTorch with the real checkpoints' state-dict keys, plus built-in presets."""
