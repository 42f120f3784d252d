"""Image inputs on the host: the wheelhouse cache keeps only the current requirements' copy; a build that
never ends is stopped."""

from __future__ import annotations

import threading
import time

import pytest

from sim.core.errors import ImageBuildError
from sim.engines.docker import stream
from sim.engines.images import IMAGES_DIR, ImageBuilder


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


def test_a_stopped_long_command_gets_to_tidy_up_first(tmp_path):
    """SIGTERM before SIGKILL: bootstrap.sh's trap removes its rootfs tarball, mmdebstrap its temporary root."""
    tidied = tmp_path / "tidied"

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    script = f"trap 'touch {tidied}; exit 1' TERM; echo started; sleep 30 & wait"
    with pytest.raises(KeyboardInterrupt):
        stream(["bash", "-c", script], interrupt, timeout_s=30)
    assert tidied.exists()


class _NoImages:
    """A Docker with no image yet: every build is due."""

    def image_exists(self, tag: str) -> bool:
        return False


def test_a_cold_build_fetches_the_host_inputs_while_the_base_image_builds(tmp_path, monkeypatch):
    events: list[str] = []
    base_started = threading.Event()

    def build_base(self, tag):
        base_started.set()
        time.sleep(0.3)  # the fetches run meanwhile
        events.append("base built")

    def wheelhouse(self):
        assert base_started.wait(5)
        events.append("wheelhouse")
        return tmp_path

    monkeypatch.setattr(ImageBuilder, "_build_base", build_base)
    monkeypatch.setattr(ImageBuilder, "wheelhouse", wheelhouse)
    monkeypatch.setattr(ImageBuilder, "etcd_binary", lambda self, version: events.append(f"etcd {version}"))
    monkeypatch.setattr(ImageBuilder, "debian_package", lambda self, package, image: events.append(package))
    builder = ImageBuilder(docker=_NoImages(), progress=lambda line: None, cache_dir=tmp_path)
    tags = builder.tags()
    with builder._fetching_meanwhile(builder._fetches(tags, need_etcd=True, etcd_version="3.4")):
        builder._build_base(tags.base)
    assert events == ["wheelhouse", "etcd 3.4", "libfaketime", "base built"]


def test_a_failed_fetch_beside_the_base_build_is_left_to_its_own_step(tmp_path, monkeypatch):
    def wheelhouse(self):
        raise ImageBuildError("pip download failed")

    monkeypatch.setattr(ImageBuilder, "wheelhouse", wheelhouse)
    builder = ImageBuilder(docker=_NoImages(), progress=lambda line: None, cache_dir=tmp_path)
    with builder._fetching_meanwhile([builder.wheelhouse]):
        pass  # the base build: no error from the fetch here
    with pytest.raises(ImageBuildError, match="pip download failed"):
        builder.wheelhouse()


def test_ctrl_c_during_the_base_build_stops_the_fetch_beside_it(tmp_path):
    builder = ImageBuilder(docker=_NoImages(), progress=lambda line: None, cache_dir=tmp_path)
    started = threading.Event()
    pip_ended = []

    def slow_pip():
        started.set()
        pip_ended.append(stream(["sleep", "30"], lambda line: None, stop=builder._stop))
        return tmp_path

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), builder._fetching_meanwhile([slow_pip]):
        assert started.wait(5)
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 10 and pip_ended and pip_ended[0] != 0


def test_a_folder_filled_once_is_whole_or_absent_and_not_filled_again(tmp_path):
    from sim.engines.images import fill_once

    target = tmp_path / "wheelhouse-abc"
    calls = []

    def broken(partial):
        (partial / "half.whl").write_text("x")
        raise ImageBuildError("pip download failed")

    with pytest.raises(ImageBuildError):
        fill_once(target, broken)
    assert not target.exists()  # an interrupted fill leaves nothing that looks whole

    def fill(partial):
        calls.append(partial.name)
        (partial / "a.whl").write_text("x")

    assert fill_once(target, fill) == target and fill_once(target, fill) == target
    assert calls == ["wheelhouse-abc.partial"] and (target / ".complete").exists() and (target / "a.whl").exists()
    assert not (tmp_path / "wheelhouse-abc.partial").exists()
