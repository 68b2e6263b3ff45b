"""gen-tuning-code: one source file per kernel variant, kernels.json, and a standalone tune.py."""
