# One command each: set up this machine, run the main job, run the tests.
PY := .venv/bin/python

.PHONY: setup up lint docs test test-full unit bench down

setup:
	bash scripts/setup.sh

up: setup
	$(PY) -m sim up --nodes 4

# Style, format and the import layers (pyproject.toml [tool.ruff], [tool.importlinter]).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

# The docs site (docs/, mkdocs.yml) into .site/; --strict: a broken link or a page missing from
# the site fails. The CLI reference page is written from sim's own parser (docs/hooks.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# The quick suite: every fault kind and outcome on every backend (sim.scenarios.shipped.QUICK_SUITE).
# Two pytest-xdist workers (CI time: about half), a test file at a time each (--dist loadfile: a
# module's shared cluster stays on one worker), in file order (--no-loadscope-reorder: xdist would
# start with the files of most tests, and the catalog's three tours, the longest file, would come last).
# At most two clusters run at once; each worker labels and sweeps its own (tests/conftest.py).
test: lint docs
	$(PY) -m pytest -v -rA --durations=25 -m "not full" -n 2 --dist loadfile --no-loadscope-reorder
	cd rendezvous-etcd-v3 && ../$(PY) -m pytest -q -rA

# Every shipped scenario on every backend it names, and every script on both backends. One at a
# time: the Swarm test's swarm init and leave must not run beside Compose clusters (docs/SWARM.md).
test-full: lint docs
	$(PY) -m pytest -v -rA --durations=25
	cd rendezvous-etcd-v3 && ../$(PY) -m pytest -q -rA

unit: setup
	$(PY) -m pytest tests/unit -q

# Benchmarks print figures (ratios against bare torchrun measured in the same run); never in CI.
bench: setup
	$(PY) bench/bench_up.py
	$(PY) bench/recovery.py
	$(PY) bench/backends.py

down:
	$(PY) -m sim down --all
