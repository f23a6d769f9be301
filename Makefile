# nsq_ha developer tasks.  `make demo` runs the main story on the embedded cluster; `make test`
# is the one test command (CI runs exactly it via .ci/run).  Both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test chaos install servers lint typecheck architecture docs docs-screenshots unit clean \
	compiled pure wheel wheel-compiled

$(PY):
	$(PYTHON) -m venv $(VENV)

# The package with the extras the tests exercise, and the project's own tools: the dependency
# groups of pyproject.toml (PEP 735), which need pip >= 25.1, hence the upgrade first.
EXTRAS := spark,cli,otel,devcluster
GROUPS := --group test --group lint --group docs --group compiled

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]' $(GROUPS)
	touch $(STAMP)

install: $(STAMP)

$(DEMO_STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cli]'
	touch $(DEMO_STAMP)

# The main job: 10k keyed, traced messages through a leader move on the embedded 3-node
# cluster, consumed ordered and plain, verified (exit 0 only if nothing was lost or reordered).
# It tries the compiled build first (below) and runs on pure Python, saying so in one line,
# where there is no C compiler or the build fails.
demo: $(DEMO_STAMP) $(VENV)/.compiled-or-pure
	@$(PY) -m nsq_ha.compiled
	$(VENV)/bin/nsq-ha demo

# The optional compiled build (docs/development.md, "The compiled build"): mypyc compiles the hot
# modules (nsq_ha.compiled.MODULES: the protocol, transport, connection and the consumer's
# per-message modules) for the virtualenv's interpreter into nsq_ha/_compiled/<tag>/, loaded only
# while every one matches its source (a stale build falls back to pure Python, saying so);
# NSQ_HA_PURE=1 selects pure Python anyway; `python -m nsq_ha.compiled` says which path is live.
# Rebuilt here when a source under those packages changes (about 2 minutes on 2 cores).
# `make pure` removes it. Needs a C compiler, Python's headers and the `compiled` group.
HOT_SOURCES := nsq_ha/_compiled_finder.py nsq_ha/transport.py nsq_ha/_sync_handout.py \
	tools/build_compiled.py \
	$(wildcard nsq_ha/protocol/*.py nsq_ha/connection/*.py nsq_ha/consumer/*.py) \
	$(wildcard nsq_ha/producer/*.py)

compiled: $(VENV)/.compiled

$(VENV)/.compiled: $(DEMO_STAMP) $(HOT_SOURCES)
	$(PY) -m pip install --quiet --group compiled
	$(PY) tools/build_compiled.py
	touch $@

# make demo's attempt: the probe says in one line why there is no compiled build, if so.
$(VENV)/.compiled-or-pure: $(DEMO_STAMP) $(HOT_SOURCES)
	@if $(PY) tools/build_compiled.py --probe; then \
		$(PY) -m pip install --quiet --group compiled && $(PY) tools/build_compiled.py --or-pure; \
	fi
	@touch $@

pure: $(PY)
	$(PY) tools/build_compiled.py --pure
	rm -f $(VENV)/.compiled $(VENV)/.compiled-or-pure

# dist/: the pure-Python wheel (any interpreter; what `pip install .` builds), and beside it the
# compiled one for the virtualenv's interpreter (the pure wheel plus the build, the .pth file that
# enables it, and its cpXY tags).
wheel: $(DEMO_STAMP)
	rm -f dist/nsq_ha-*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

wheel-compiled: wheel $(VENV)/.compiled
	$(PY) tools/build_compiled.py --wheel dist

# Build (or find in ~/.cache/nsq_ha/servers) the real fork and vanilla servers.  A server that
# cannot be built is reported here and then skipped by the tests (or fails them under
# NSQ_HA_REQUIRE_SERVERS, as in CI).
servers: $(STAMP)
	$(PY) -m nsq_ha.testing.build --keep-going

lint: $(STAMP)
	$(PY) -m ruff check nsq_ha tests

typecheck: $(STAMP)
	$(PY) -m mypy --strict nsq_ha

# The layering in ARCHITECTURE.md (import-linter contracts in pyproject.toml: layers, the
# embedded broker's independence, the client core importing none of the other products, no
# import cycle); the module sizes, naming those over 600 lines (split them by noun) and
# failing on one over 1000; the client core's lines and that its import loads no other product.
architecture: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) tools/module_sizes.py nsq_ha --target 600 --limit 1000
	$(PY) tools/core_lines.py --summary

# The docs site (Furo) into docs/_build/html (git-ignored): the README as the landing page, the
# guide's Markdown pages in docs/ (their blocks run by tests/integration/test_readme.py), the
# command line's page generated from its parser (sphinx-argparse), the API reference (autodoc).
# A warning is an error; -E re-reads every page, so a second run reports what the first did.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -E -q -b html -d docs/_build/doctrees docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# What a reader sees: the landing page, the Quickstart and the Producer's API page, rendered by
# headless Chromium (Debian's chromium package) at a laptop's width into docs/screenshots/.
SHOTS := index quickstart api/producer
docs-screenshots: docs
	@mkdir -p docs/screenshots
	@for page in $(SHOTS); do \
	  out=docs/screenshots/$$(basename $$page).png; \
	  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 \
	    --screenshot=$$out file://$(CURDIR)/docs/_build/html/$$page.html 2>/dev/null || exit 1; \
	  echo "docs-screenshots: $$out"; \
	done

# The whole suite on $(PYTHON) (3.11) and the extra interpreters' runs (below), as two streams
# side by side, each one's output printed whole when it ends: the real-server tests (integration
# and chaos: clusters, failovers and timeouts, mostly waiting) beside the rest (unit, harness,
# conformance on 3.11, then 3.12 on the compiled build, then 3.13: mostly computing; every other
# run on pure Python). On 2 cores one stream each; one
# after the other took make test to 45 minutes. `pythons` first, so that a missing interpreter
# fails at once rather than after the 3.11 suite.
test: pythons servers lint typecheck architecture docs
	$(MAKE) --no-print-directory -j2 --output-sync=target test-servers test-rest

TEST_SERVER_DIRS := tests/integration tests/chaos

.PHONY: test-servers test-rest test-fast
# The 3.11 and 3.13 runs test pure Python (NSQ_HA_PURE=1, even where `make compiled` built the
# hot modules for .venv); the 3.12 run tests the compiled build (below).
test-servers: $(STAMP)
	NSQ_HA_PURE=1 $(PY) -m pytest --durations=30 $(TEST_SERVER_DIRS)

test-fast: $(STAMP)
	NSQ_HA_PURE=1 $(PY) -m pytest --durations=10 tests $(addprefix --ignore=,$(TEST_SERVER_DIRS))

test-rest:
	$(MAKE) --no-print-directory test-fast
	$(MAKE) --no-print-directory -j$(VERSION_JOBS) --output-sync=target test-versions

# The other interpreters CI tests, each in its own virtualenv (.venv-3.12, .venv-3.13: the cli
# and otel extras and the test group): the unit tests and the integration tests on the embedded
# cluster.  Left to the 3.11 run: the real servers (-m deselects fork and vanilla, and
# NSQ_HA_EMBEDDED_ONLY=1 skips a test that reaches one without its marker), Spark (the spark
# extra; its JVM runs take minutes), the benchmark and chaos runs, and the README test (its
# Quickstart builds a venv with the python3 on PATH, not this interpreter).
# tools/find_python.sh finds each: pythonX.Y on PATH if it runs, else pyenv's; none fails.
# make test runs them one after the other (VERSION_JOBS=1), in the stream beside the real-server
# tests; alone, `make test-versions VERSION_JOBS=2` runs both side by side (6.5 min on 2 cores,
# no longer than one alone).
PYTHON_VERSIONS := 3.12 3.13
VERSION_JOBS ?= 1
VERSION_EXTRAS := cli,otel
VERSION_ARGS := tests/unit tests/integration \
	-m "not fork and not vanilla and not spark and not bench and not chaos" \
	--ignore-glob='tests/integration/test_spark*.py' --ignore=tests/integration/test_readme.py
VERSION_TESTS := $(addprefix test-,$(PYTHON_VERSIONS))

.PHONY: pythons test-versions $(VERSION_TESTS)
.PRECIOUS: .venv-%/.installed-test .venv-%/.compiled

pythons:
	@for v in $(PYTHON_VERSIONS); do \
		found=$$(tools/find_python.sh $$v) || exit 1; echo "Python $$v: $$found"; done

# A new virtualenv whenever pyproject.toml changes (the interpreter may have changed too).
.venv-%/.installed-test: pyproject.toml
	py=$$(tools/find_python.sh $*) && rm -rf .venv-$* && "$$py" -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet -e '.[$(VERSION_EXTRAS)]' --group test
	touch $@

test-versions: $(VERSION_TESTS)

# No real server is required (none runs); pytest's own status fails the target, 5 (no test
# collected) included.
$(VERSION_TESTS): test-%: .venv-%/.installed-test
	NSQ_HA_EMBEDDED_ONLY=1 NSQ_HA_REQUIRE_SERVERS=0 $(PATH_ENV) .venv-$*/bin/python -m pytest $(VERSION_ARGS) $(PATH_ARGS)

# The compiled build's run: 3.12's unit and embedded-cluster tests on the hot modules compiled by
# mypyc (make compiled, for .venv-3.12; rebuilt when a source changes, about 2 minutes), where
# NSQ_HA_EXPECT_COMPILED=1 makes tests/unit/test_compiled.py fail if the build is not live. One
# warning is ignored there: mypyc's runtime passes an exception on to an awaited object with
# throw(type, value, traceback), which Python 3.12 deprecates. The other runs: pure Python.
COMPILED_VERSION := 3.12
THROW_WARNING := the (type, exc, tb) signature of throw() is deprecated
PATH_ENV := NSQ_HA_PURE=1
test-$(COMPILED_VERSION): .venv-$(COMPILED_VERSION)/.compiled
test-$(COMPILED_VERSION): PATH_ENV := NSQ_HA_EXPECT_COMPILED=1
test-$(COMPILED_VERSION): PATH_ARGS := -W 'ignore:$(THROW_WARNING):DeprecationWarning'

.venv-%/.compiled: .venv-%/.installed-test $(HOT_SOURCES)
	.venv-$*/bin/python -m pip install --quiet --group compiled
	.venv-$*/bin/python tools/build_compiled.py
	touch $@

# The long chaos profile (>= 100 nemesis events over >= 500k messages per cluster) and a long
# fuzz run of the decoders; `make test` runs the CI profile of the same suite.  On the fork it
# also runs the same schedule on topics with nsqd's default sync interval and prints both
# reports side by side (a measurement: those topics lose acknowledged writes on a crash).
# NSQ_HA_CHAOS_PROFILE=ci and CHAOS_ARGS='-k fork' make a shorter run.
CHAOS_ARGS ?=
chaos: servers
	NSQ_HA_CHAOS_PROFILE=$${NSQ_HA_CHAOS_PROFILE:-long} NSQ_HA_CHAOS_COMPARE=1 \
		NSQ_HA_FUZZ_EXAMPLES=$${NSQ_HA_FUZZ_EXAMPLES:-20000} \
		$(PY) -m pytest tests/chaos $(CHAOS_ARGS)

# The benchmark's CPU mode: instructions per message of every client under valgrind's
# callgrind, two counts each (bench/README.md, "CPU mode"); 30 minutes to an hour on 2 shared cores, so
# `make test` runs only a smoke of it.  BENCH_CPU_ARGS='--no-peers' or '--only consume'.
BENCH_CPU_ARGS ?=
.PHONY: bench-cpu
bench-cpu: servers
	$(VENV)/bin/nsq-ha bench --cpu $(BENCH_CPU_ARGS)

unit: $(STAMP)
	$(PY) -m pytest tests/unit

clean:
	rm -rf $(VENV) $(addprefix .venv-,$(PYTHON_VERSIONS)) .pytest_cache .mypy_cache .ruff_cache .hypothesis .chaos-reports docs/_build \
		nsq_ha/_compiled build/mypyc
