# uncaged-workflow: build, demo, test, lint.
#
#   make demo    build everything and run the solve-issue example on the offline agent
#   make test    run every test (unit, integration, guest fixtures, the web view in Chromium),
#                the store contract and the CLI-only tests on both stores (a real PostgreSQL,
#                and a PgBouncer in front of it for the contract and the crash tests)
#   make lint    rustfmt and clippy, host and guests
#   make fuzz    the property tests of every parser, with 20,000 cases each (make test runs 256)
#   make test-crash  kill -9 at random points of run, fork, resume and thread rm, 100 times each
#   make test-pgbouncer  the database store's CLI tests again, through a transaction-pooling PgBouncer
#
# Every target installs what it needs (the wasm32-wasip2 Rust target) when missing.

CARGO        ?= cargo
GUEST_TARGET := wasm32-wasip2
GUEST_DIR    := target/$(GUEST_TARGET)/guest
BIN          := target/debug/uncaged-workflow
# The demo keeps its state inside the repository, never in your real home.
DEMO_HOME    ?= $(CURDIR)/target/demo-home
BUNDLES      := solve-issue develop review-panel

.PHONY: all build bundles language-tools demo test lint fmt clean guest-target bench fuzz test-crash test-pgbouncer \
	interpreter check-interpreter browser postgres bench-postgres bench-serve bench-agents bench-mcp bench-starts bench-fleet bench-instances bench-evals install-check mcp-servers

all: build bundles

guest-target:
	@rustup target list --installed 2>/dev/null | grep -qx $(GUEST_TARGET) || rustup target add $(GUEST_TARGET)

build:
	$(CARGO) build -p uncaged-workflow

# Every example bundle: Rust (cargo), Python (componentize-py) and JavaScript
# (componentize-js), their tools installed into target/ when missing.
bundles: guest-target language-tools target/bundles/solve_issue_py.wasm target/bundles/solve_issue_js.wasm \
	target/bundles/review_panel_py.wasm target/bundles/review_panel_js.wasm
	$(CARGO) build --target $(GUEST_TARGET) --profile guest $(addprefix -p ,$(BUNDLES))

language-tools:
	bundles/build-tools.sh

target/bundles/solve_issue_py.wasm: bundles/solve-issue-py/app.py $(wildcard guest-sdk/python/*.py) wit/workflow.wit | language-tools
	bundles/build-bundle.sh python bundles/solve-issue-py $@

target/bundles/solve_issue_js.wasm: bundles/solve-issue-js/app.js guest-sdk/js/uncaged-workflow.js wit/workflow.wit | language-tools
	bundles/build-bundle.sh js bundles/solve-issue-js $@

target/bundles/review_panel_py.wasm: bundles/review-panel-py/app.py $(wildcard guest-sdk/python/*.py) wit/workflow.wit | language-tools
	bundles/build-bundle.sh python bundles/review-panel-py $@

target/bundles/review_panel_js.wasm: bundles/review-panel-js/app.js guest-sdk/js/uncaged-workflow.js wit/workflow.wit | language-tools
	bundles/build-bundle.sh js bundles/review-panel-js $@

demo: build guest-target
	$(CARGO) build --target $(GUEST_TARGET) --profile guest -p solve-issue
	@echo "== add the solve-issue bundle (home: $(DEMO_HOME))"
	UNCAGED_WORKFLOW_HOME=$(DEMO_HOME) $(BIN) add solve-issue $(GUEST_DIR)/solve_issue.wasm
	@echo "== run it with the built-in scripted agent (offline)"
	UNCAGED_WORKFLOW_HOME=$(DEMO_HOME) $(BIN) run solve-issue -p "Fix the crash when the input file is empty" \
		--agent scripted:bundles/solve-issue/demo-answers.yaml
	@echo "== the thread it left on disk"
	UNCAGED_WORKFLOW_HOME=$(DEMO_HOME) $(BIN) threads solve-issue
	UNCAGED_WORKFLOW_HOME=$(DEMO_HOME) $(BIN) thread $$(UNCAGED_WORKFLOW_HOME=$(DEMO_HOME) $(BIN) threads solve-issue --json | sed -n 's/.*"threadId": "\([0-9A-Z]*\)".*/\1/p' | tail -n 1)

# The interpreter of declarative (YAML) workflows ships inside the host binary as a committed
# build (as wasmtime ships its WASI adapters), so that the same YAML gives the same bundle
# bytes on every machine. Paths are remapped so that the build does not depend on where the
# repository or the cargo home is; `check-interpreter` proves the committed file is current.
INTERPRETER     := runtime/src/declarative/interpreter.wasm
INTERP_TARGET   := target/interpreter
INTERP_FLAGS    := --remap-path-prefix=$(CURDIR)=/uncaged-workflow \
	--remap-path-prefix=$(or $(CARGO_HOME),$(HOME)/.cargo)=/cargo
INTERP_BUILT    := $(INTERP_TARGET)/$(GUEST_TARGET)/guest/declarative_interpreter.wasm

$(INTERP_BUILT): guest-target
	RUSTFLAGS="$(INTERP_FLAGS)" $(CARGO) build --target $(GUEST_TARGET) --profile guest \
		-p declarative-interpreter --target-dir $(INTERP_TARGET)

interpreter: $(INTERP_BUILT)
	cp $(INTERP_BUILT) $(INTERPRETER)

check-interpreter: $(INTERP_BUILT)
	@cmp -s $(INTERP_BUILT) $(INTERPRETER) || { echo "$(INTERPRETER) is not the build of \
	declarative/ and wit/: run \`make interpreter\` and commit it"; exit 1; }

.PHONY: $(INTERP_BUILT)

# The language tests use the Python and JavaScript bundles and toolchains `bundles` builds;
# the web view's tests drive a real headless Chromium over WebDriver; the durable-agent tests
# run real MCP servers, which `mcp-servers` installs.
test: bundles check-interpreter browser postgres install-check mcp-servers
	$(CARGO) test

# The MCP servers the durable-agent tests run, at pinned versions, into target/: the official
# Python SDK and mcp-server-time from PyPI, @modelcontextprotocol/server-filesystem from npm.
mcp-servers:
	tests/mcp/install.sh

# The README's install command works: the same `cargo install --locked --path runtime`, as a
# debug build into target/ (it reuses the test build instead of a seven-minute release one).
install-check:
	$(CARGO) install --locked --path runtime --debug --root target/install-check --target-dir target --quiet
	target/install-check/bin/uncaged-workflow --version

# PostgreSQL and PgBouncer from the distribution's packages, installed when missing: the
# shared-store tests start their own server with it (initdb in a temporary directory), and a
# PgBouncer in transaction-pooling mode in front of it.
postgres:
	@{ ls /usr/lib/postgresql/*/bin/initdb && ls /usr/sbin/pgbouncer; } >/dev/null 2>&1 || { \
		echo "== installing postgresql and pgbouncer (the shared-store tests start their own)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q postgresql pgbouncer; }

# Every test of the database store that goes through the CLI, again through PgBouncer in
# transaction-pooling mode (make test runs the store contract and the crash tests through it).
test-pgbouncer: guest-target postgres
	UNCAGED_TEST_PG_VIA=pgbouncer $(CARGO) test -p uncaged-workflow --test cli postgres

# Chromium and its WebDriver from the distribution's packages, installed when missing.
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
		echo "== installing chromium and chromium-driver (the web view's tests use them)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; }

lint: guest-target
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -p uncaged-workflow -p uncaged-test-artifacts -- -D warnings
	$(CARGO) clippy --all-targets -p uncaged-workflow-declarative -- -D warnings
	$(CARGO) clippy --target $(GUEST_TARGET) -p uncaged-workflow-sdk -p declarative-interpreter $(addprefix -p ,$(BUNDLES)) -p guest-adversary -p guest-bad-schema -p guest-descriptor \
		-p guest-bad-import -p guest-no-workflow-export -- -D warnings

fmt:
	$(CARGO) fmt --all

# The crash trials at length (make test runs 3 of each): every kill is reported with the lost
# or duplicated steps and repeated agent calls it caused, which must all be zero.
CRASH_TRIALS ?= 100
test-crash: guest-target
	UNCAGED_CRASH_TRIALS=$(CRASH_TRIALS) $(CARGO) test -p uncaged-workflow --test cli crash -- --nocapture

# Property tests of every parser of untrusted bytes (runtime/src/fuzz.rs), at length: a fixed
# seed, so a failure reproduces; UNCAGED_FUZZ_SEED=N explores elsewhere.
FUZZ_CASES ?= 20000
fuzz: guest-target
	UNCAGED_FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test -p uncaged-workflow --lib fuzz -- --test-threads 2

clean:
	$(CARGO) clean

# Benchmarks: criterion micro-benchmarks, whole workflows against LangGraph and a native floor,
# concurrency; writes BENCHMARKS.md. Installs LangGraph into target/bench-venv.
bench: guest-target postgres mcp-servers
	python3 runtime/benches/report.py

# The PostgreSQL part of the benchmarks alone, put in place in BENCHMARKS.md.
bench-postgres: guest-target postgres
	python3 runtime/benches/report.py --only postgres

# `serve` under load alone (stalled connections, thousands of live views), put in place.
bench-serve: guest-target
	python3 runtime/benches/report.py --only serve

# Starts in bursts alone (API and webhooks on both stores, a start while every worker is busy).
bench-starts: guest-target postgres
	python3 runtime/benches/report.py --only starts

# A fleet of threads on one provider limit alone (two workers on one PostgreSQL, a provider
# that enforces its own limits), put in place.
bench-fleet: guest-target postgres
	python3 runtime/benches/report.py --only fleet

# One worker holding N waiting threads, and answer → next step of a thread that gave its
# instance up, alone, put in place.
bench-instances: guest-target
	python3 runtime/benches/report.py --only instances

# Evals alone: the overhead over the live calls they make, recorded steps judged per second.
bench-evals: guest-target
	python3 runtime/benches/report.py --only evals

# MCP's starts beside the API's alone (starts per second, time to the first step).
bench-mcp: guest-target
	python3 runtime/benches/report.py --only mcp

# The durable agents' part of the benchmarks alone (journaling per turn, live text's latency).
bench-agents: mcp-servers
	python3 runtime/benches/report.py --only agents
