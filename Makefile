# paperscale: `make test` (what CI runs), `make demo` (raw text -> BLEU on 2 CPU ranks) and
# `make bench` (every bench at full size -> bench/RESULTS.md).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PS := $(VENV)/bin/paperscale
TORCH ?= torch==2.13.0
CORPUS ?= corpus/debian-ende
DATA ?= data/debian-ende
DEMO_RUN ?= runs/demo
# fairseq, the peer bench/peer_fairseq.py measures against, in its own venv (it pins
# omegaconf < 2.1 and hydra 1.0): the same torch, then fairseq-fixed from PyPI.
FAIRSEQ_VENV ?= .venv-fairseq
FAIRSEQ ?= fairseq-fixed==0.12.3.1
BY_SOURCE ?= corpus/debian-ende-by-source
export OMP_NUM_THREADS ?= 1
export WANDB_SILENT := true
# DeepSpeed's JIT-compiled ops live in the venv (built once by `make venv`, see trainer/ds/ops.py).
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: venv test test-fast test-gpu demo bench fairseq-venv lint format clean

venv: $(VENV)/.installed $(VENV)/.ds_ops

# torch first, from the given spec (a CPU wheel here; on a GPU cluster pass e.g.
# TORCH="torch --index-url https://download.pytorch.org/whl/cu124"), then the project.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,serve]'
	$(PY) -c "import torch, deepspeed, webdataset, sentencepiece, wandb, transformers, ctranslate2; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'ctranslate2', ctranslate2.__version__)"
	touch $@

$(VENV)/.ds_ops: $(VENV)/.installed
	$(PY) -m trainer.ds.ops
	touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The suite in two parts: everything but the `serial` tests on TEST_WORKERS pytest-xdist
# workers (tests sharing a module or session fixture, and the Slurm ones, stay together on
# one worker: their xdist_group marks), then the `serial` tests, which assert a time or a
# speed, alone. A worker that crashes is not replaced: under --dist loadgroup its replacement
# waited forever, so a crash hung the suite instead of failing it.
TEST_WORKERS ?= 2
test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0 -m "not serial and not gpu"
	$(VENV)/bin/pytest -q -ra --durations=5 -m "serial and not gpu"

test-fast: venv
	$(VENV)/bin/pytest -q -m "not slow and not gpu"

# The CUDA tests (tests/gpu), on a machine with a GPU; each has a CPU twin in `make test`.
test-gpu: venv
	$(VENV)/bin/pytest -q -ra -m gpu tests/gpu

$(CORPUS)/corpus.json: | venv
	$(PS) corpus fetch debian-ende $(CORPUS)

# The same corpus with its training pairs grouped by source, as concatenated corpora arrive.
$(BY_SOURCE)/corpus.json: | venv
	$(PS) corpus fetch debian-ende $(BY_SOURCE) --train-order source

fairseq-venv: $(FAIRSEQ_VENV)/.installed

$(FAIRSEQ_VENV)/.installed:
	test -x $(FAIRSEQ_VENV)/bin/python || python3 -m venv $(FAIRSEQ_VENV)
	$(FAIRSEQ_VENV)/bin/python -m pip install -q --upgrade pip
	$(FAIRSEQ_VENV)/bin/python -m pip install -q $(TORCH) cython numpy setuptools wheel
	$(FAIRSEQ_VENV)/bin/python -m pip install -q --no-build-isolation $(FAIRSEQ)
	$(FAIRSEQ_VENV)/bin/python -c "import fairseq, torch; print('fairseq', fairseq.__version__, 'torch', torch.__version__)"
	touch $@

$(DATA)/manifest.json: $(CORPUS)/corpus.json
	$(PS) prepare $(CORPUS) $(DATA) --config configs/tiny.yaml --workers 2

# configs/demo.yaml: the tiny preset's layers at half width on a time budget (DEMO_MINUTES=N
# for another one).
demo: venv $(DATA)/manifest.json
	rm -rf $(DEMO_RUN)
	$(PS) train --config configs/demo.yaml --nproc 2 --run-dir $(DEMO_RUN) data.dir=$(DATA) \
		$(if $(DEMO_MINUTES),train.budget_minutes=$(DEMO_MINUTES))
	$(PS) evaluate $(DEMO_RUN) --data $(DATA) --split test --beam 4 --show 5
	$(PS) status $(DEMO_RUN)

# Every bench in bench/ at full size, one after another (hours on a small CPU machine); rewrites
# bench/RESULTS.md. BENCH_ONLY=decode,sinks runs some and replaces only their tables.
bench: venv $(CORPUS)/corpus.json $(BY_SOURCE)/corpus.json fairseq-venv
	$(PY) -m bench.suite $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

clean:
	rm -rf $(DEMO_RUN) .pytest_cache
