# Two commands a new user needs: `make run` and `make test`. Both set up what
# they need (a virtualenv from PyPI, Delta's jars from Maven Central) and are
# safe to run again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
JARS_STAMP := .cache/ivy/.delta-jars
# Debian's chromium: the status page's test drives a real browser.
BROWSER_STAMP := .cache/.chromium

.PHONY: run test test-fast test-long typecheck setup bench bench-compare proto clean

# Each set-up step shows a live line (what it does, seconds so far, the usual
# time, the last line its tool printed); the tools' own output goes to $(SETUP_LOG).
SETUP_LOG := .cache/setup.log
STEP = $(PYTHON) taproot_ops/console.py --log $(SETUP_LOG)

setup: $(STAMP) $(JARS_STAMP)

$(STAMP): pyproject.toml
	@echo "set-up 1/2: Python packages into $(VENV) (once; what pip prints goes to $(SETUP_LOG))"
	@test -x $(BIN)/python || $(STEP) --what "a virtualenv in $(VENV)" --usually 5 -- $(PYTHON) -m venv $(VENV)
	@$(STEP) --what "pip, upgraded" --usually 5 -- $(BIN)/python -m pip install --upgrade pip
	@$(STEP) --what "pyspark, delta-spark, deltalake, grpcio, pytest, ... from PyPI" --usually 50 -- \
		$(BIN)/python -m pip install -e '.[server,test]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

$(JARS_STAMP): $(STAMP)
	@echo "set-up 2/2: Delta's jars from Maven Central into .cache/ivy (once; Ivy's lines go to $(SETUP_LOG))"
	@$(STEP) --what "delta-spark's jars" --usually 25 -- $(BIN)/python -m storage.spark
	@touch $(JARS_STAMP)

# RUN_ARGS: more of `taproot run`'s flags (`make run RUN_ARGS="--data-dir /tmp/x"`).
run: setup
	@$(BIN)/taproot run $(RUN_ARGS)

$(BROWSER_STAMP):
	@command -v chromium >/dev/null || { \
	  echo "installing Debian's chromium for the status page's browser test (apt-get, about 20 s)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null || { $$SUDO apt-get update -q >/dev/null && \
	    $$SUDO apt-get install -y -q chromium >/dev/null; }; }
	mkdir -p .cache && touch $@

# The tests start hundreds of Python processes (pytest's workers, the roles,
# the CLI): each reads Taproot's compiled modules from __pycache__ instead of
# compiling them again, even where the environment says not to write them
# (PYTHONDONTWRITEBYTECODE=1, as on this machine: each pytest worker then
# spent 6.4 s collecting instead of 2.6 s, mostly rewriting the test modules).
test test-fast test-long: export PYTHONDONTWRITEBYTECODE :=

test: setup $(BROWSER_STAMP)
	@$(STEP) --what "SeaweedFS, the object-store tests' S3 server (built once from the Go module proxy)" \
		--usually 240 -- $(BIN)/python -m taproot_ops.object_store
	@$(STEP) --what "hadoop-aws and the AWS SDK bundle for Spark on S3 (once, about 690 MB)" --usually 120 -- \
		$(BIN)/python -m storage.spark --object-store
	@$(STEP) --what "a class-data archive of Spark's classes, so the suite's JVMs start faster (once)" \
		--usually 40 -- $(BIN)/python -m taproot_ops.jvm_archive
	$(BIN)/python -m ruff check --quiet .
	$(BIN)/python -m mypy
	@echo "pytest on two workers: the modules that share no session fixture and no shipped port beside the rest (tests/conftest.py, BESIDE)"
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25

# The unit tier on both cores (pytest-xdist), each property test with a third
# of the suite's examples (`--fast`, tests/conftest.py): under 30 s here.
test-fast: $(STAMP)
	$(BIN)/python -m ruff check --quiet .
	$(BIN)/python -m pytest -m unit -n 2 --fast

# The long tiers (about 25 minutes until 2026-12-06, an estimated 6 more since the
# dispatcher's fresh-path test scales with the tier): the fuzz tier and the property tests 100 times longer and
# from a fresh seed (printed; rerun with TAPROOT_FUZZ_SEED=N), every start-up
# order of node, proxy, pipeline and client.
test-long: setup
	$(BIN)/python -m pytest --long tests/test_fuzz_config.py tests/test_fuzz_frames.py tests/test_fuzz_reload.py \
		tests/test_start_order.py tests/test_columns.py tests/test_dispatcher.py

typecheck: $(STAMP)
	$(BIN)/python -m mypy

# BlazingMQ's scenarios against an embedded cluster; plots and JSON in bench-out/.
bench: setup
	$(BIN)/python -m pip install --quiet -e '.[server,test,bench]'
	$(BIN)/taproot bench --scenario all --out bench-out

# Kafka, NATS JetStream and RabbitMQ, each driven by its own load tools (fetched
# or built once), then Taproot, on the same work: tables in bench-out/compare.md.
bench-compare: setup
	$(BIN)/python -m pip install --quiet -e '.[server,test,bench]'
	$(BIN)/taproot bench --compare --out bench-out

proto: $(STAMP)
	$(BIN)/python -m pip install --quiet 'grpcio-tools>=1.85.1'
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. protocol/taproot.proto
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. taproot_ops/sparkconnect/connect_subset.proto

clean:
	rm -rf $(VENV) .cache data
