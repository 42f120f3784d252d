"""Image inputs on the host: the wheelhouse cache keeps only the current requirements' copy."""

from __future__ import annotations

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
