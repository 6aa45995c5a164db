# rollstack: `make demo` runs the main job, `make test` runs the tests. Each sets itself up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXECD := native/build/rollstack-execd
TREECP := native/build/rollstack-treecp
ROOTSWITCH := native/build/rollstack-rootswitch
CRIU := /usr/local/libexec/rollstack/criu
# Harbor needs Python >= 3.12 (the project's venv is 3.11): its provider runs in a venv of its
# own with this package's source on its path (docs/harbor.md)
HARBOR_VENV := .venv-harbor
HARBOR_PY ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
HARBOR_STAMP := $(HARBOR_VENV)/.installed

.PHONY: setup demo test lint test-unit test-integration bench-quick clean

setup: $(STAMP) $(EXECD) $(TREECP) $(ROOTSWITCH) $(CRIU) $(HARBOR_STAMP)

$(HARBOR_STAMP): requirements/harbor.txt
	test -n "$(HARBOR_PY)" || { echo "setup: Harbor needs a Python 3.12 (pyenv install 3.12 or apt-get install python3.12)" >&2; exit 1; }
	test -x $(HARBOR_VENV)/bin/python || $(HARBOR_PY) -m venv $(HARBOR_VENV)
	$(HARBOR_VENV)/bin/pip install -q -r requirements/harbor.txt
	$(HARBOR_VENV)/bin/python -c 'import site, sys; open(site.getsitepackages()[0] + "/rollstack-src.pth", "w").write(sys.argv[1] + "\n")' $(CURDIR)/src
	$(HARBOR_VENV)/bin/python -c 'import harbor, rollstack.integrations.harbor'
	touch $(HARBOR_STAMP)

# the static in-sandbox exec agent / PID 1 (docs/runtime.md), the fork's tree copy and the
# late-bound sandboxes' root switch (docs/fork.md); Debian's gcc + libc6-dev
$(EXECD) $(TREECP) $(ROOTSWITCH) &: native/execd/execd.c native/treecp/treecp.c native/rootswitch/rootswitch.c native/build.sh scripts/setup-system.sh
	bash scripts/setup-system.sh
	bash native/build.sh

# CRIU 4.1.1 for checkpointed pauses (docs/fork.md): Debian 12's criu cannot start on Linux 6.18
$(CRIU): third_party/criu/build.sh scripts/setup-system.sh
	bash scripts/setup-system.sh
	bash third_party/criu/build.sh
	touch $(CRIU)

$(STAMP): pyproject.toml scripts/setup-system.sh third_party/pyfuse3/build.sh third_party/pyfuse3/rollstack.patch
	bash scripts/setup-system.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==24.3.1
	bash third_party/pyfuse3/build.sh $(BIN)
	$(BIN)/pip install -q -e '.[dev,minisweagent,adapters,cluster]'
	$(BIN)/pip install -q --no-deps 'verifiers==0.4.0' 'prime-sandboxes==0.5.1'  # see the adapters extra in pyproject.toml
	$(BIN)/python -c 'import pyfuse3; assert pyfuse3.ROLLSTACK_PATCH, "the patched pyfuse3 is not installed"'
	touch $(STAMP)

demo: setup
	$(BIN)/rollstack demo

test: setup
	$(BIN)/python -m pytest -q -ra tests

# ruff over everything; mypy strict where it is cheap (contract, format, plan, tasks), default over lowers
lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy --strict src/rollstack/contract src/rollstack/format src/rollstack/plan src/rollstack/tasks
	$(BIN)/mypy src/rollstack/lowers

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

test-integration: setup
	$(BIN)/python -m pytest -q -ra tests/integration

bench-quick: setup
	$(BIN)/rollstack bench init --quick

clean:
	rm -rf $(VENV) $(HARBOR_VENV)
