"""What `google-tunix` pulls into an environment that already holds matpo_jax: the installed
distributions reachable from tunix's requirements but not from ours, walked through the installed
metadata (extras not taken, environment markers evaluated), with their versions.

    python benchmarks/peers/deps.py [--out benchmarks/results/peers_deps.json]
"""
from __future__ import annotations

import argparse
import json
import re
from importlib import metadata

from packaging.requirements import Requirement


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str) -> set[str]:
    seen, todo = set(), [_canon(root)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for spec in dist.requires or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_canon(req.name))
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    ours, theirs = closure("matpo_jax"), closure("google-tunix")
    extra = sorted(theirs - ours - {"google-tunix"})
    report = dict(
        tunix=metadata.version("google-tunix"),
        tunix_requires=[str(r) for r in metadata.distribution("google-tunix").requires
                        if "extra ==" not in r],
        added_by_tunix={name: metadata.version(name) for name in extra},
        shared_with_matpo_jax={name: metadata.version(name) for name in sorted(theirs & ours)
                               if name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint",
                                           "transformers", "safetensors", "numpy", "grain")})
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
