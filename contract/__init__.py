"""What a stage may use besides the cache and the IR: the job it receives, kiln's error, the
model config, the machine facts, the key-part protocol for stages with dynamic keys, the
toolchain and small shared helpers. It imports nothing of kiln but the cache."""
