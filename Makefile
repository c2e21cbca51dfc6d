# seam — every target sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.installed-core
STAMP  := $(VENV)/.installed-all
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM ?= true
# Real public samples for the reader tests, when this checkout sits beside them (CI does).
export SEAM_REALWORLD_DIR ?= $(wildcard $(CURDIR)/../shared/realworld)
# The newer real files (issue 22: attachments, compaction calls, forked and multi-snapshot Codex),
# apart so the tests over SEAM_REALWORLD_DIR keep their counts.
export SEAM_REALWORLD_NEW_DIR ?= $(wildcard $(CURDIR)/../shared/realworld-new)

SAMPLE := data/sample
# make test-fast: the core (segment/mask/rows/advantage property and hand-checked tests, GAE,
# the readers' unit tests), -m "not slow"
FAST_TESTS := $(addprefix tests/core/,test_properties.py test_segment_ids.py \
	test_segments_hand_checked.py test_mask_options.py test_drop_truncated.py test_witness.py \
	test_fidelity.py) tests/trainer/test_gae.py tests/readers

# Property tests that draw fewer examples in make test than in make fuzz (tests/examples.py)
DEEP_PROPERTY_TESTS := tests/readers/test_run_together.py tests/core/test_long_text.py \
	tests/core/test_chat_jinja.py tests/trainer/test_gae.py tests/readers/test_call_delta.py \
	tests/core/test_tokenizer.py tests/gateway/test_gateway_delta.py

.PHONY: setup build-rl-shards build-sft test test-all test-fast test-wheel test-trainers lint mutate bench fuzz report train-step clean

# The main job needs only the core install (no torch, no aiohttp, no matplotlib); tests,
# training and benchmarks add every extra but trainers (torch==2.13.0 CPU, the gateway's
# aiohttp, the report's matplotlib, the LLM judge's client, hypothesis, Ray Data, ...).
TEST_EXTRAS := train,gateway,report,judge-llm,dev
$(CORE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(BIN)/pip install -q -e '.[$(TEST_EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

## The main job: RL shards from the embedded sample into out/rl/
build-rl-shards: $(CORE)
	$(BIN)/seam build-rl $(SAMPLE) --out out/rl --overwrite

## SFT shards (judge corrections, filters, audit columns) + preference pairs into out/sft/
build-sft: $(CORE)
	$(BIN)/seam build-sft $(SAMPLE) --out out/sft --overwrite
	$(BIN)/seam audit out/sft

## The everyday loop: every test but the slow integration ones (marked `slow`), in two
## pytest-xdist workers, one per core (the session builds are shared: tests/built_once.py).
## TEST_WORKERS=0 runs one process (CI does: its other lanes use the second core).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/pytest -m "not slow" -n $(TEST_WORKERS) --dist loadscope --durations=15

## Every test, the slow integration tests included (what CI runs)
test-all: $(STAMP)
	$(BIN)/pytest --durations=15

## The core in under a minute: schemas, segment/mask/rows/advantage properties, readers' unit tests
test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow" $(FAST_TESTS)

## The wheel: built, installed with the extras each command needs into fresh virtualenvs (cached in
## ~/.cache/seam/wheel-venvs), every command's documented example run from it outside the repository;
## the extras' one-line refusals
test-wheel: $(STAMP)
	$(BIN)/pytest -q tests/packaging

## The exports through the real TRL and verl, in their own virtualenv (verl pins transformers<5.11)
TRAINERS := .venv-trainers
$(TRAINERS)/.installed: pyproject.toml
	test -x $(TRAINERS)/bin/python || $(PYTHON) -m venv $(TRAINERS)
	$(TRAINERS)/bin/pip install -q --upgrade pip
	$(TRAINERS)/bin/pip install -q torch==2.13.0
	$(TRAINERS)/bin/pip install -q '.[trainers]' 'pytest>=8' 'hypothesis>=6.100'
	touch $@

test-trainers: $(TRAINERS)/.installed
	PYTHONPATH=$(CURDIR) $(TRAINERS)/bin/python -m pytest -p no:cacheprovider \
		tests/export/test_with_trl.py tests/export/test_with_verl.py \
		tests/export/test_with_verl_rl.py tests/export/test_with_verl_sft.py \
		tests/export/test_with_verl_cpu_trainer.py \
		tests/export/test_with_verl_gae.py tests/export/test_with_verl_gae_trainer.py

## Style and types: ruff lint, ruff format check, mypy (config in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Mutation run over segment/mask/rows/advantage/GAE; survivors explained in docs/mutation.md
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py

clean:
	rm -rf out

## Two PPO steps on CPU on out/rl with a tiny random Qwen2-style model built locally (no download)
out/tiny-model/config.json: $(STAMP)
	$(BIN)/seam make-tiny-model --out out/tiny-model

train-step: build-rl-shards out/tiny-model/config.json
	$(BIN)/seam train-step out/rl --model out/tiny-model --steps 2 --device cpu \
		--rollouts-per-step 2 --max-step-tokens 16384 --recompute-old-logprobs

## One self-contained HTML page (plots + standard tables) about out/rl
report: build-rl-shards $(STAMP)
	$(BIN)/seam report out/rl --html out/report.html --overwrite

## Long robustness run: 300 random examples per fuzz test, 40 SIGKILLs, 7 disk-full sizes (~10 min)
fuzz: $(STAMP)
	SEAM_FUZZ_EXAMPLES=300 SEAM_CRASH_KILLS=40 $(BIN)/pytest -q -s tests/robustness
	SEAM_EXHAUSTIVE=1 $(BIN)/pytest -q tests/core/test_incremental_rendering.py
	SEAM_DEEP_PROPERTIES=1 $(BIN)/pytest -q $(DEEP_PROPERTY_TESTS)

## Benchmarks (~15 min on 2 cores): ratios measured in one run, table on stdout, numbers in out/bench.json
bench: $(STAMP)
	$(BIN)/python bench/run.py
