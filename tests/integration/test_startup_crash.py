"""A script that fails at every start (an import of a package the node does not have), run as a user
runs their own script: the run fails fast, and the verdict's first diagnosis is script-error, naming the
exception, the user's file:line and source line, and the fix; the restart-budget diagnosis no longer
advises more restarts. One short run (two nodes, one restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_an_import_error_at_every_start_is_named_first(sim_scenario, docker, images, tmp_path):
    path = tmp_path / "startup-crash.yaml"
    path.write_text(f"""\
name: startup-crash
description: a script whose team package is missing in the nodes
cluster:
  nodes: 2
  nproc_per_node: 1
  max_restarts: 1
  rdzv_backend: etcd-v2
  script: {SCRIPTS / "own_package_import.py"}
profile: fast
seed: 3
steps: []
expect:
  outcome: fails
timeout: 2m
""")
    (result,) = sim_scenario(str(path))
    summary = result.summary
    why = summary[summary.index("Why (known causes") :]
    first = why.splitlines()[1]
    flat = " ".join(why.split())  # the report wraps its lines: read it as one
    assert first.startswith("Diagnosis 1/2 [script-error]: The script fails at every start"), summary
    assert "ModuleNotFoundError: No module named 'teamlib'" in first, summary
    # The script runs from the node-local copy of its project (the checkout's git root).
    assert "/opt/sim/project/tests/scripts/own_package_import.py:12 in <module>" in flat, summary
    assert "from teamlib.model import Net" in flat, summary
    assert "ended 4 worker-group" in flat, summary
    assert "--project-dir" in why and "--requirements" in why, summary
    assert "[restart-budget]" in why and "More restarts would not help" in flat, summary
