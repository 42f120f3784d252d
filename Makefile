# One command each: set up this machine, run the main job, run the tests.
PY := .venv/bin/python

.PHONY: setup up lint test unit bench down

setup:
	bash scripts/setup.sh

up: setup
	$(PY) -m sim up --nodes 4

# Style, format and the import layers (pyproject.toml [tool.ruff], [tool.importlinter]).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

test: lint
	$(PY) -m pytest -v -rA --durations=15
	cd rendezvous-etcd-v3 && ../$(PY) -m pytest -q -rA

unit: setup
	$(PY) -m pytest tests/unit -q

bench: setup
	$(PY) bench/bench_up.py

down:
	$(PY) -m sim down --all
