# kiln: two commands on a fresh machine.
#   make compile MODEL=mlp [TARGET=cpu|cuda]   creates the environment if missing, then compiles
#   make test                                   ruff, mypy --strict, pytest
#   make bench MODEL=mlp [TARGET=cpu|cuda]      kiln against eager, torch.compile and AOTInductor
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL ?= mlp
KILN_FLAGS ?=
BENCH_FLAGS ?=
TARGET_FLAG := $(if $(TARGET),--target $(TARGET),)

.PHONY: compile test lint typecheck pytest test-gpu bench bench-recompile bench-lower-schedule clean env

env: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)

compile: $(VENV)/.ready
	$(PY) -m kiln compile $(MODEL) $(TARGET_FLAG) $(KILN_FLAGS)

# Note: the tests spread over the cores (pytest-xdist), a file's tests on one worker so each
# file's shared fixtures (a module's compile cache) are built once: on a 2-core machine the suite
# took 18:42 one at a time and 11:30 this way.
test: $(VENV)/.ready
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not gpu and not slow" -q -n auto --dist loadfile

# Note: the tests marked slow (full-size bert and gpt2 through lower and schedule, the bench's
# smoke runs with every engine) take minutes each and add nothing make test's small configs do
# not check in the code they run; they kept make test near its 30 minutes on 2 cores. Run them
# before resolving an issue that touches what they cover.
.PHONY: test-slow
test-slow: $(VENV)/.ready
	$(PY) -m pytest -m "slow and not gpu" -q -n auto --dist loadfile

# On the GPU machine: no environment to build (no network there); use what python3 has.
test-gpu:
	python3 scripts/run_gpu_tests.py $(GPU_TEST_ARGS)

# kiln, eager, torch.compile and AOTInductor on one model: a table, kiln's compile profile,
# build/bench/MODEL-TARGET/bench.json and bench.png; BENCH_FLAGS="--runs 100 --engines kiln,aoti" etc.
# TARGET=cuda is for the GPU machine: no environment to build there (no network), so python3 itself.
BENCH_PY := $(if $(filter cuda,$(TARGET)),python3,$(PY))
bench: $(if $(filter cuda,$(TARGET)),,$(VENV)/.ready)
	$(BENCH_PY) -m kiln bench $(MODEL) $(TARGET_FLAG) $(BENCH_FLAGS)

bench-recompile: $(VENV)/.ready
	$(PY) bench/recompile.py $(MODEL)

bench-lower-schedule: $(VENV)/.ready
	$(PY) bench/lower_schedule.py $(MODEL)

# kiln vs AOTInductor vs eager on CPU; MODELS="mlp bert" picks models (default: mlp bert-small gpt2-small)
.PHONY: bench-cpu
bench-cpu: $(VENV)/.ready
	$(PY) bench/cpu_backend.py $(MODELS)

# kiln vs eager, torch.compile and AOTInductor on the GPU (the device machine: uses python3 there)
.PHONY: bench-cuda
bench-cuda:
	python3 bench/cuda_backend.py $(MODELS)

# Breadth, not in `make test` (each takes tens of minutes): PyTorch's OpInfo database through
# kiln.compile (OPINFO_FLAGS="--sample 150 --seed 0" for a sample), and the model zoo (on the GPU
# machine: python3 scripts/zoo.py --target cuda, with torchvision and timm).
.PHONY: opinfo zoo
opinfo: $(VENV)/.ready
	$(PY) scripts/opinfo.py --classes $(OPINFO_FLAGS)

zoo: $(VENV)/.ready
	$(PY) scripts/zoo.py $(ZOO_FLAGS)

clean:
	rm -rf build
