# One command each: set up this machine, run the main job, run the tests.
PY := .venv/bin/python

.PHONY: setup up test unit bench down

setup:
	bash scripts/setup.sh

up: setup
	$(PY) -m sim up --nodes 4

test: setup
	$(PY) -m pytest -v -rA --durations=15

unit: setup
	$(PY) -m pytest tests/unit -q

bench: setup
	$(PY) bench/bench_up.py

down:
	$(PY) -m sim down --all
