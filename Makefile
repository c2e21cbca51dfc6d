# seam — every target sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export SEAM_CACHE_DIR ?= $(CURDIR)/.seam-cache
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM ?= true
# Real public samples for the reader tests, when this checkout sits beside them (CI does).
export SEAM_REALWORLD_DIR ?= $(wildcard $(CURDIR)/../shared/realworld)

SAMPLE := data/sample

.PHONY: setup build-rl-shards build-sft test bench fuzz report train-step clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[train,dev]'
	touch $(STAMP)

setup: $(STAMP)

## The main job: RL shards from the embedded sample into out/rl/
build-rl-shards: $(STAMP)
	$(BIN)/seam build-rl $(SAMPLE) --out out/rl --overwrite

## The test suite (hypothesis property tests included)
test: $(STAMP)
	$(BIN)/pytest -q

clean:
	rm -rf out .seam-cache
