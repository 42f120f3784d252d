"""Image inputs on the host: the wheelhouse cache keeps only the current requirements' copy; a build that
never ends is stopped."""

from __future__ import annotations

import time

import pytest

from sim.docker import stream
from sim.errors import ImageBuildError
from sim.images import IMAGES_DIR, ImageBuilder


def test_a_new_wheelhouse_replaces_those_of_older_requirements(tmp_path, monkeypatch):
    pip_calls = []
    monkeypatch.setattr(ImageBuilder, "_run_pip", lambda self, argv: pip_calls.append(argv[3]))
    old = tmp_path / "wheelhouse-0123456789abcdef"
    (old / "torch.whl").parent.mkdir(parents=True)
    (old / "torch.whl").write_text("stale")
    (old / ".complete").write_text("")
    other_cache = tmp_path / "etcd"
    other_cache.mkdir()

    builder = ImageBuilder(docker=None, progress=lambda line: None, cache_dir=tmp_path)
    target = builder.wheelhouse()

    assert pip_calls == ["wheel", "wheel", "download"]  # python-etcd, the etcd-v3 rendezvous package, the rest
    assert target.name.startswith("wheelhouse-") and target != old
    assert (target / ".complete").exists()
    assert (target / "requirements.txt").read_text() == (IMAGES_DIR / "runtime" / "requirements.txt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, "etcd"])
    # A second call finds it complete and fetches nothing.
    assert builder.wheelhouse() == target and pip_calls == ["wheel", "wheel", "download"]


def test_the_rendezvous_package_sources_key_the_runtime_image(tmp_path):
    package = tmp_path / "rendezvous-etcd-v3"
    (package / "src" / "rendezvous_etcd_v3").mkdir(parents=True)
    (package / "pyproject.toml").write_text("[project]\n")
    module = package / "src" / "rendezvous_etcd_v3" / "backend.py"
    module.write_text("x = 1\n")
    builder = ImageBuilder(docker=None, progress=lambda line: None, cache_dir=tmp_path, rendezvous_dir=package)
    before = builder.runtime_tag("base:1")
    (package / "build").mkdir()
    (package / "build" / "leftover.py").write_text("")  # a build's leftovers change nothing
    assert builder.runtime_tag("base:1") == before
    module.write_text("x = 2\n")
    assert builder.runtime_tag("base:1") != before


def test_a_long_command_that_does_not_end_is_stopped_with_one_line(tmp_path):
    lines: list[str] = []
    assert stream(["sh", "-c", "echo one; exit 3"], lines.append, timeout_s=30) == 3 and lines == ["one"]
    with pytest.raises(ImageBuildError, match=r"did not end within 0.01 min and was stopped"):
        stream(["sh", "-c", "echo started; sleep 30"], lines.append, timeout_s=0.6)
    assert lines[-1] == "started"


def test_an_interrupted_long_command_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "still-running"

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stream(["sh", "-c", f"(sleep 2; touch {marker}) & echo started; wait"], interrupt, timeout_s=30)
    time.sleep(3)
    assert not marker.exists()  # the child was stopped with its parent
