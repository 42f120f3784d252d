"""images/node's boundary: the code that runs inside every node (the instrumentation, the device emulation, the
clock, the progress API) imports only the standard library, torch, and its own modules.

Its files are copied as top-level modules into the node image's site-packages (images/node/Dockerfile) and
loaded by elastic-sim.pth in every Python process there, the user's script's included; `sim` and `chaos` are
not installed in the image. They are no package that `lint-imports` can build a graph of (only
elastic_sim_progress is importable on the host), so this test reads their imports, local ones included, and
holds them to the boundary that a layers contract holds the packages to. It also holds the other side: the
host packages import none of the node's modules (they reach them only as code run inside a node).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "images" / "node"
THIRD_PARTY = {"torch"}  # the node image's own: it runs where torch is installed, and only there


def _node_modules() -> set[str]:
    return {path.stem for path in NODE.glob("*.py")}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) for every import in a file, those inside functions and try blocks too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import: these are top-level modules, so it could only fail in the image
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module:
                found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_the_node_code_imports_only_the_standard_library_torch_and_itself():
    allowed = set(sys.stdlib_module_names) | THIRD_PARTY | _node_modules() | {"__future__"}
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted(NODE.glob("*.py"))
        for line, module in _imports(path)
        if module not in allowed
    ]
    assert not wrong, "the node image has only the standard library, torch and images/node: " + "; ".join(wrong)


def test_the_pth_loads_only_node_modules_and_the_image_copies_them_all():
    pth = (NODE / "elastic-sim.pth").read_text().splitlines()
    loaded = {line.split()[1] for line in pth if line.startswith("import")}
    assert loaded <= _node_modules()
    copied = " ".join(line for line in (NODE / "Dockerfile").read_text().splitlines() if line.startswith("COPY"))
    assert {f"{name}.py" for name in _node_modules()} <= set(copied.split())


def test_the_host_packages_import_no_node_module():
    node = _node_modules() - {"elastic_sim_progress"}  # the progress API is also a host module (a no-op there)
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for package in ("sim",)
        for path in sorted((ROOT / package).rglob("*.py"))
        if "_data" not in path.parts
        for line, module in _imports(path)
        if module in node
    ]
    assert not wrong, "; ".join(wrong)


def test_the_boundary_check_sees_a_local_import_of_the_host_packages(tmp_path):
    """The reader finds what a violation would look like: a host import inside a function."""
    script = tmp_path / "elastic_sim_x.py"
    script.write_text("def f():\n    try:\n        from sim.core import spec\n    except ImportError:\n        pass\n")
    assert (3, "sim") in _imports(script)
