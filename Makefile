# Two commands do all set-up on a fresh Linux machine with Python >= 3.11:
#   make demo   installs codepool into .venv and runs the main job
#   make test   installs codepool into .venv and runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench lint e2b-test

$(BIN)/codepool: pyproject.toml setup.py worker/engine/_nativechild.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,embedded]'
	touch $@

demo: $(BIN)/codepool
	$(BIN)/codepool doctor --preload numpy,sympy
	mkdir -p build && rm -f build/replay.jsonl
	$(BIN)/codepool replay ops/examples/rollouts.jsonl -o build/replay.jsonl --timeout 3 --compare --report build/replay.html

# Test files are spread over TEST_WORKERS processes, each file's tests kept on one (their
# module fixtures are made once); every test starts its own servers on free ports.
TEST_WORKERS ?= 3
test: $(BIN)/codepool
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# E2B's own SDK tests against codepool serve (docs/e2b.md): minutes, so not in `make test`.
# E2B_REPO: a checkout of e2b-dev/code-interpreter (cloned into build/ when missing).
E2B_REPO ?= build/e2b-code-interpreter
e2b-test: $(BIN)/codepool
	$(BIN)/pip install -q -e '.[test,embedded,e2b]'
	$(BIN)/python -m tests.e2b_suite $(E2B_REPO)

bench: $(BIN)/codepool
	$(BIN)/python ops/bench/executor.py

# Type-check the mapped folders as the `codepool` package they install as.
lint: $(BIN)/codepool
	$(BIN)/pip install -q ruff mypy msgpack-types
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/typecheck && mkdir -p build/typecheck/codepool
	for d in common worker producer ops; do ln -s ../../../$$d build/typecheck/codepool/$$d; done
	cd build/typecheck && MYPYPATH=. ../../$(BIN)/mypy --strict --exclude examples/ -p codepool.common -p codepool.producer -p codepool.worker -p codepool.ops
