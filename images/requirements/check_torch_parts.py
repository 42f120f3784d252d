"""Load each requirement's compiled torch parts with the image's torch, at build time (images/requirements).

argv[1]: JSON, distribution name -> its shared objects that link torch (paths in the wheel). Each is loaded
with torch.ops.load_library (which registers its operators), then one compiled operator is called where
the package is known (torchvision: nms). Any failure ends the build with the package, the file and why.
"""

import importlib.metadata
import json
import sys

import torch

# One compiled operator per known package, called on a tiny input.
OPERATOR_CALLS = {
    "torchvision": "torchvision.ops.nms(torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.1]]), "
    "torch.tensor([0.9, 0.8]), 0.5)",
}


def main() -> int:
    parts = json.loads(sys.argv[1])
    for name, libraries in parts.items():
        dist = importlib.metadata.distribution(name)
        for member in libraries:
            path = dist.locate_file(member)
            try:
                torch.ops.load_library(str(path))
            except (OSError, RuntimeError) as error:
                print(
                    f"elastic-sim: {name} {dist.version}: {member} does not load on torch {torch.__version__}: {error}",
                    file=sys.stderr,
                )
                return 1
        call = OPERATOR_CALLS.get(name.lower())
        if call is not None:
            module = __import__(name.lower())
            try:
                eval(call, {"torch": torch, name.lower(): module})
            except Exception as error:
                print(f"elastic-sim: {name} {dist.version}: {call.split('(')[0]} failed: {error}", file=sys.stderr)
                return 1
        checked = f"{len(libraries)} compiled part(s) loaded" + (f", {call.split('(')[0]} ran" if call else "")
        print(f"elastic-sim: {name} {dist.version} on torch {torch.__version__}: {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
