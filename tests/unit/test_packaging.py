"""The built wheel carries everything `sim` reads at run time (images/, compose/, trainer/, the
shipped scenarios), and an install of it tags its images as the checkout does, so a user's
install reuses images built from a checkout. Builds one wheel (a few seconds, no Docker)."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from sim.engines.images import ImageBuilder, _tree_files
from tests.wheel_build import ROOT, build_wheel

DATA = "sim/_data"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as pip lays it out in site-packages."""
    site = tmp_path_factory.mktemp("site-packages")
    zipfile.ZipFile(wheel).extractall(site)
    return site


def wheel_files(wheel: Path, prefix: str) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name[len(prefix) :]: archive.read(name) for name in archive.namelist() if name.startswith(prefix)}


@pytest.mark.parametrize("folder", ["images", "compose", "trainer"])
def test_wheel_holds_each_project_folder_file_for_file(wheel, folder):
    expected = {str(p.relative_to(ROOT / folder)): p.read_bytes() for p in _tree_files(ROOT / folder)}
    assert expected, f"{folder}/ is empty in the checkout"
    assert wheel_files(wheel, f"{DATA}/{folder}/") == expected


def test_wheel_holds_the_shipped_scenarios_and_their_format(wheel):
    expected = {p.name: p.read_bytes() for p in (ROOT / "chaos" / "scenarios").iterdir() if p.is_file()}
    assert "FORMAT.md" in expected
    assert wheel_files(wheel, f"{DATA}/chaos/scenarios/") == expected


def test_installed_layout_tags_images_as_the_checkout_does(installed, tmp_path):
    data = installed / DATA
    from_wheel = ImageBuilder(None, images_dir=data / "images", trainer_dir=data / "trainer", cache_dir=tmp_path)
    assert from_wheel.tags() == ImageBuilder(None, cache_dir=tmp_path).tags()


def test_installed_package_finds_its_files_without_a_checkout(installed):
    # Run from the unpacked wheel: its sim/ comes first on sys.path.
    code = (
        "import sim, sim.core.paths as p, sim.scenarios.shipped as c; "
        "print(p.PROJECT_FILES == p.PACKAGE_DIR / '_data', p.COMPOSE_TEMPLATE.is_file(), "
        "(p.IMAGES_DIR / 'node' / 'Dockerfile').is_file(), len(c.shipped_paths()) > 0, sim.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    *checks, module = done.stdout.split()
    assert checks == ["True"] * 4, done.stdout
    assert module.startswith(str(installed))


def test_wheel_declares_the_tools_dependencies_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as archive:
        info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
        names = set(archive.namelist())
    required = {re.match(r"[\w.-]+", r)[0].lower() for r in metadata.get_all("Requires-Dist")}
    assert {"pyyaml", "matplotlib"} <= required
    assert "torch" not in required  # torch runs inside the node images, not in the tool
    assert entry_points["pytest11"]["elastic_sim"] == "sim.pytest_plugin"
    assert entry_points["console_scripts"]["sim"] == "sim.cli.main:main"
    assert "elastic_sim_progress.py" in names  # the one-line API, a no-op on the host
