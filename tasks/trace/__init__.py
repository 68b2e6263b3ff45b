"""The trace stage: build the model from its config, torch.export it, and write the exported
program (no weights, canonical JSON) and the weights (safetensors).

Note: this package's __init__ must stay torch-free: the runner imports tasks.trace.keys to
compute the stage's key, and a no-op compile must never pay for importing torch. The stage
itself lives in tasks.trace.stage and runs in a worker process.
"""
