"""CosyVoice3 (work in progress): its PyTorch networks with upstream's state-dict keys.

The leading underscore keeps this folder out of plug-in discovery until the family is complete.
"""
