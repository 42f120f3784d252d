"""Build step: an installed elastic-sim carries the folders the tool reads at run time.

images/, compose/ and trainer/ stay at the top of the checkout, where sim/core/paths.py
finds them. A wheel (built from the checkout, an sdist or a git URL) gets a copy
of them in sim/_data/, taken at build time: whatever those folders hold then,
without a list of files to keep in step. Editable installs read the checkout.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# sim/core/paths.py reads the same names, beside sim/ or in sim/_data/.
PROJECT_FOLDERS = ("images", "compose", "trainer", "rendezvous-etcd-v3", "chaos")
DATA_PACKAGE_DIR = Path("sim", "_data")


def project_files(folder: Path) -> list[Path]:
    # The files sim/engines/images.py hashes into image tags (all but bytecode), so a
    # wheel's copy yields the same tags and reuses images built from a checkout.
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.name.endswith(".pyc")
        and not any(part.endswith(".egg-info") or part == "build" for part in p.relative_to(folder).parts)
    )


class BuildPyWithProjectFolders(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        data_dir = Path(self.build_lib) / DATA_PACKAGE_DIR
        # A build/ folder left by an earlier in-tree build may hold files deleted since.
        shutil.rmtree(data_dir, ignore_errors=True)
        for name in PROJECT_FOLDERS:
            for source in project_files(HERE / name):
                target = data_dir / source.relative_to(HERE)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)  # keeps the mode: bootstrap.sh stays executable


setup(cmdclass={"build_py": BuildPyWithProjectFolders})
