"""A training script that imports its team's own package, as scripts in a project tree do
(`from teamlib.model import Net`), run without that package beside it: it fails at import, at every start.

The start-up crash a user meets first when only the script's own folder reaches the nodes: the
script-error diagnosis names the module, the line, and `--project-dir` / `--requirements` as the fix.
"""

import os

import torch
import torch.distributed as dist
from teamlib.model import Net  # the team's own package: not in the node, not beside this file


def main():
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(Net())
    print(f"rank {os.environ['RANK']}: {model}")


if __name__ == "__main__":
    main()
