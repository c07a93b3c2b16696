"""Validation of builds against the FP32 reference: metrics, checks, report, gate."""
