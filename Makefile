# The two commands: `make up` runs the stack, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test lint typecheck accuracy clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

up: $(VENV)/.installed
	$(BIN)/draftgate up

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy gateway planner backends

test: lint typecheck
	$(BIN)/pytest

# Regenerate the planner's accuracy report (tests fail when the committed one is stale).
accuracy: $(VENV)/.installed
	$(BIN)/python -m planner.accuracy > planner/ACCURACY.md

clean:
	rm -rf $(VENV) .draftgate .pytest_cache .mypy_cache .ruff_cache
