"""`sim vet` end to end: real clusters, real torchrun, real faults, the scorecard and its files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tests.conftest import ROOT, run_sim, unique_name

SCRIPTS = ROOT / "tests" / "scripts"


def _rows(stdout: str) -> dict[str, str]:
    """Scorecard rows by label (the lines after the header)."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("fault") or " fault " in line)
    rows = [line for line in lines[header + 1 :] if line[:5] in ("PASS ", "FAIL ", "n/a  ", "MISS ")]
    return {line[5:39].strip(): line for line in rows}


def test_quick_vet_of_a_plain_ddp_script_passes_and_writes_its_files(images, tmp_path):
    """fixed_name_ckpt.py (plain DDP, rank 0 saves model + optimizer to /ckpt, a 10 s process-group timeout)
    through the five most telling faults, on two clusters at once: every one survived, exit 0, vet.json, vet.html
    and JUnit written."""
    junit = tmp_path / "vet-junit.xml"
    result = run_sim(
        "vet",
        str(SCRIPTS / "fixed_name_ckpt.py"),
        "--quick",
        "--name",
        unique_name("vet-q"),
        "--out",
        str(tmp_path),
        "--junit",
        str(junit),
        "--",
        "--steps",
        "100000",
        "--pg-timeout",
        "10",
        timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _rows(result.stdout)
    assert len(rows) == 5 and all(row.startswith("PASS") for row in rows.values()), result.stdout
    data = json.loads((tmp_path / "vet.json").read_text())
    assert data["passed"] and [f["kind"] for f in data["faults"]] == [
        "kill-worker",
        "kill-node",
        "restart-node",
        "scale-up",
        "hang-collectives",
    ]
    assert all(f["recovery_s"] for f in data["faults"])
    # Two clusters at once (the default), each with its share: every fault scored from its own cluster's run.
    assert data["clusters"] == 2 and len({f["run_dir"] for f in data["faults"]}) == 2 == len(data["run_dirs"])
    page = (tmp_path / "vet.html").read_text()
    assert page.count("data:image/png;base64,") == 5
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "0"


def test_vet_of_a_tutorial_node_local_snapshot_fails_its_scale_up_naming_why(images, tmp_path):
    """The PyTorch multinode tutorial's snapshot (snapshot.pt in the working directory, local rank 0 of each
    node): the node that joins has none and starts afresh while the others resume. The scale-up fails, with
    the node-local and resumed-from-different-points diagnoses first, each rank's source named."""
    junit = tmp_path / "vet-junit.xml"
    result = run_sim(
        "vet",
        str(SCRIPTS / "tutorial_snapshot.py"),
        "--faults",
        "scale-up",
        "--name",
        unique_name("vet-t"),
        "--out",
        str(tmp_path),
        "--junit",
        str(junit),
        "--",
        "100000",
        "5",
        timeout=400,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    rows = _rows(result.stdout)
    assert rows["a node joining (scale up)"].startswith("FAIL"), result.stdout
    (scale,) = json.loads((tmp_path / "vet.json").read_text())["faults"]
    assert scale["outcome"] == "failed" and "loaded nothing (started afresh)" in scale["why"]
    codes = [d["code"] for d in scale["diagnoses"]]
    assert codes[:2] == ["node-local-checkpoint", "resumed-apart"], codes
    sources = scale["diagnoses"][1]["evidence"]
    # snapshot.pt relative to the working folder: the node's own copy of the project (/opt/sim/project)
    assert any("loaded /opt/sim/project/snapshot.pt" in e for e in sources), sources
    assert any("loaded nothing" in e for e in sources)
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert failure.get("message").startswith("Checkpoint on node-local storage. Fix:")
