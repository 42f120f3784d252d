"""The import contract (pyproject.toml, checked by `lint-imports` in `make lint`) names every module.

import-linter's layers contract constrains only the modules it lists: a new module left out of
it could import anything. This test keeps the list whole.
"""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _contract_modules() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return {module.strip() for layer in contract["layers"] for module in layer.replace("|", ":").split(":")}


def _package_modules() -> set[str]:
    modules = set()
    for package in ("sim", "chaos"):
        for path in (ROOT / package).glob("*.py"):
            if path.stem != "__init__":
                modules.add(f"{package}.{path.stem}")
    return modules


def test_every_module_has_a_layer():
    missing = sorted(_package_modules() - _contract_modules())
    assert not missing, f"add these to a layer of [tool.importlinter] in pyproject.toml: {missing}"


def test_the_contract_names_no_missing_module():
    assert not sorted(_contract_modules() - _package_modules())
