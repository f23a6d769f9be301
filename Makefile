# nsq_ha developer tasks.  `make test` is the one test command (CI runs exactly it via .ci/run).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test

.PHONY: test install servers lint typecheck unit clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Build (or find in ~/.cache/nsq_ha/servers) the real fork and vanilla servers.  A server that
# cannot be built is reported here and then skipped by the tests (or fails them under
# NSQ_HA_REQUIRE_SERVERS, as in CI).
servers: $(STAMP)
	$(PY) -m nsq_ha.testing.build --keep-going

lint: $(STAMP)
	$(PY) -m ruff check nsq_ha tests

typecheck: $(STAMP)
	$(PY) -m mypy --strict nsq_ha

test: servers lint typecheck
	$(PY) -m pytest

unit: $(STAMP)
	$(PY) -m pytest tests/unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
