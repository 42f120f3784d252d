"""Checkpoint-volume faults: damage the newest checkpoint, fill the disk (and remove a file again).

Their kinds (sim/core/faultkinds/disk.py, checkpoint.py) say what to do; here are the `Nemesis` methods for Python
callers and what the executor does on the cluster's shared checkpoint storage (its node scripts, its checks).
"""

from __future__ import annotations

import posixpath

from sim.core.errors import FaultError, UsageError
from sim.core.faultkinds import checkpoint, disk
from sim.faults import nodescripts
from sim.faults.verbbase import SHARED_CKPT_DIR, _last


class DiskFaults:
    def corrupt_checkpoint(
        self, target: str = "random", *, mode: str = "bitflip", directory: str = SHARED_CKPT_DIR
    ) -> dict:
        """Damage the newest file under `directory` (shared by every node): flip bits, or truncate it."""
        return self.carry_out(checkpoint.CORRUPT_CHECKPOINT, checkpoint.CorruptOptions(target, mode, directory))

    def fill_disk(self, target: str = "random", *, directory: str = SHARED_CKPT_DIR, leave: int = 0) -> dict:
        """Fill the checkpoint disk until `leave` bytes are free (sim/core/faultkinds/disk.py)."""
        self._require_own_ckpt_storage(directory)  # its own message first, as the options would refuse some too
        return self.carry_out(disk.FILL_DISK, disk.FillOptions(target, directory, leave))

    def _require_own_ckpt_storage(self, directory: str) -> None:
        """A filler goes only on the cluster's own size-limited checkpoint storage: /ckpt (or a folder
        in it) of a cluster started with ckpt_size. The node script checks the mount itself too."""
        normal = posixpath.normpath(directory)
        if (
            not directory.startswith("/")
            or ".." in directory.split("/")
            or not (normal == SHARED_CKPT_DIR or normal.startswith(SHARED_CKPT_DIR + "/"))
        ):
            raise UsageError(
                f"--dir {directory!r}: fill-disk fills only the cluster's checkpoint storage; "
                f"give {SHARED_CKPT_DIR} or a folder in it"
            )
        spec = self.cluster.spec
        if spec is not None and spec.ckpt_size is None:
            raise UsageError(
                f"fill-disk: cluster '{self.cluster.name}' has no size-limited checkpoint storage; "
                "start it with --ckpt-size, e.g. --ckpt-size 64m"
            )

    def _node_script(
        self, node: str, what: str, script: str, *args: object, act: str | None = None, hint: str = ""
    ) -> dict:
        result = self.cluster.exec(node, *nodescripts.argv(script, *args, act=act), timeout=120)
        if result.exit_code == nodescripts.WRONG_REQUEST:
            raise UsageError(f"{node}: {what}: {_last(result.stderr)}{hint}")
        if not result.ok:
            raise FaultError(f"{node}: {what} failed: {_last(result.stderr)}")
        return nodescripts.parse_result(node, what, result.stdout)

    def _remove_file(self, node: str, file: str) -> None:
        removed = self.cluster.exec(node, "rm", "-f", file)
        if not removed.ok:
            raise FaultError(f"{node}: removing {file} failed: {_last(removed.stderr)}")
