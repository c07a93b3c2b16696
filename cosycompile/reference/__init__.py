"""The PyTorch FP32 reference: runners over the real modules, and its outputs as a cached step."""
