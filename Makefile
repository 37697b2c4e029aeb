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

setup: $(STAMP) $(JARS_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

$(JARS_STAMP): $(STAMP)
	$(BIN)/python -m storage.spark
	touch $(JARS_STAMP)

run: setup
	$(BIN)/taproot run

$(BROWSER_STAMP):
	@command -v chromium >/dev/null || { \
	  echo "installing Debian's chromium for the status page's browser test (apt-get, about 20 s)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q chromium >/dev/null || { $$SUDO apt-get update -q >/dev/null && \
	    $$SUDO apt-get install -y -q chromium >/dev/null; }; }
	mkdir -p .cache && touch $@

test: setup $(BROWSER_STAMP)
	$(BIN)/python -m taproot_ops.object_store
	$(BIN)/python -m storage.spark --object-store
	$(BIN)/python -m ruff check --quiet .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest

# The unit tier on both cores (pytest-xdist): 33 s in one process on this machine, 21 s in two.
test-fast: $(STAMP)
	$(BIN)/python -m ruff check --quiet .
	$(BIN)/python -m pytest -m unit -n 2

# The long tiers (about 25 minutes): the fuzz tier and the property tests 100 times longer and
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

# The same scenarios on Taproot, RabbitMQ (quorum queues) and NATS (JetStream),
# each installed from Debian's packages if missing and started on loopback.
bench-compare: setup
	$(BIN)/python -m pip install --quiet -e '.[server,test,bench]'
	$(BIN)/taproot bench --scenario all --compare --out bench-out

proto: $(STAMP)
	$(BIN)/python -m pip install --quiet 'grpcio-tools>=1.85.1'
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. protocol/taproot.proto

clean:
	rm -rf $(VENV) .cache data
