"""The import contracts (pyproject.toml, checked by `lint-imports` in `make lint`) name every module.

import-linter's layers contract constrains only the modules it lists: a module left out of it could
import anything. Every module of a layer package (LAYER_PACKAGES) must have its sub-layer in that
package's own contract; every other module must be listed by name.
"""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
LAYER_PACKAGES = (
    "sim.core",
    "sim.engines",
    "sim.verdict",
    "sim.verdict.diagnoses",
    "sim.faults",
    "sim.scenarios",
    "sim.vet",
    "sim.export",
    "sim.cli",
)


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _names(layer: str) -> list[str]:
    return [name.strip() for name in layer.replace("|", ":").split(":")]


def _contract_modules() -> set[str]:
    modules = set()
    for contract in _contracts():
        if contract["type"] == "independence":  # "pkg.*": every module of pkg, one a new module joins by itself
            modules.update(contract["modules"])
            continue
        if contract["type"] != "layers":
            continue
        (container,) = contract.get("containers", [""])
        for layer in contract["layers"]:
            modules.update(f"{container}.{name}" if container else name for name in _names(layer))
    return modules


def _package_modules() -> set[str]:
    modules = set()
    for package in ("sim",):
        for path in (ROOT / package).rglob("*.py"):
            if "_data" in path.parts:
                continue
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules.add(dotted.removesuffix(".__init__"))
    return modules - {"sim"}


def _named(module: str, names: set[str]) -> bool:
    return module in names or any(n.endswith(".*") and module.rpartition(".")[0] == n[:-2] for n in names)


def test_every_module_has_a_layer():
    names = _contract_modules()
    missing = sorted(m for m in _package_modules() if not _named(m, names))
    assert not missing, f"add these to a layer of [tool.importlinter] in pyproject.toml: {missing}"


def test_the_contracts_name_no_missing_module():
    modules = _package_modules()
    named = {n[:-2] if n.endswith(".*") else n for n in _contract_modules()}
    assert not sorted(named - modules)


def test_each_layer_package_orders_its_own_modules():
    containers = {c["containers"][0] for c in _contracts() if c["type"] == "layers" and c.get("containers")}
    assert containers == set(LAYER_PACKAGES)


def test_the_verdict_may_not_reach_docker_a_process_or_the_clock():
    (forbidden,) = [c for c in _contracts() if c["type"] == "forbidden"]
    assert {"docker", "subprocess", "time", "sim.engines"} <= set(forbidden["forbidden_modules"])
    assert {"sim.verdict.runmodel", "sim.verdict.checkers", "sim.verdict.diagnoses"} <= set(forbidden["source_modules"])
