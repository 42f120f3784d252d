"""docs/CI.md: its workflows parse, and every command they run is one the documentation (the README and
the docs site's pages) documents."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "CI.md").read_text(encoding="utf-8")
# The README and every page of the docs site (docs/): where a user reads about a command.
README = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def _yaml_blocks() -> list[dict]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC, re.S)]


def _sim_commands(workflow: dict) -> list[str]:
    """The `python -m sim ...` lines a workflow runs (GitHub steps' run, GitLab's script)."""
    lines = []
    for job in workflow.get("jobs", {"job": workflow}).values():
        for step in job.get("steps", []):
            lines += str(step.get("run", "")).splitlines()
        lines += [str(line) for line in job.get("script", [])]
        if "vet" in workflow:
            lines += [str(line) for line in workflow["vet"].get("script", [])]
    return [line.strip() for line in lines if line.strip().startswith("python -m sim")]


def test_both_workflows_parse_and_upload_the_html_and_junit_files():
    github, gitlab = _yaml_blocks()
    steps = github["jobs"]["vet"]["steps"]
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert {"vet.html", "vet-junit.xml"} <= set(upload["with"]["path"].split())
    assert upload["if"] == "always()"
    job = gitlab["vet"]
    assert {"vet.html", "vet-junit.xml"} <= set(job["artifacts"]["paths"])
    assert job["artifacts"]["reports"]["junit"] == "vet-junit.xml" and job["artifacts"]["when"] == "always"


def test_every_sim_command_of_the_workflows_is_documented():
    github, gitlab = _yaml_blocks()
    commands = _sim_commands(github) + [str(line) for line in gitlab["vet"]["script"]]
    assert any(" vet " in f" {c} " for c in commands)
    for command in commands:
        words = shlex.split(command)
        assert words[:3] == ["python", "-m", "sim"], command
        assert f"python -m sim {words[3]}" in README, f"{command}: `sim {words[3]}` is not in the docs"
        for flag in (w.split("=")[0] for w in words[4:] if w.startswith("--")):
            assert flag in README, f"{command}: {flag} is not in the docs"


def test_the_workflow_commands_parse_with_sims_own_parser():
    from sim.cli.main import build_parser

    github, gitlab = _yaml_blocks()
    for command in _sim_commands(github) + [str(line) for line in gitlab["vet"]["script"]]:
        build_parser().parse_args(shlex.split(command)[3:])


def test_the_readme_is_short_and_each_of_its_links_is_a_file_here():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "the README links to the docs site's pages"
    for link in links:
        assert link.startswith("http") or (ROOT / link).is_file(), f"README links to {link}, which is not here"
