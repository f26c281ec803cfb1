"""Median µs per step of each timed method, per process (``sitecustomize.py`` in this folder wrote them).

``python benchmarks/step_timing/table.py FOLDER [--skip N]``: the first ``N`` steps (default 20:
compilation, prompts) are left out; a step that did not call a method counts 0 for it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def medians(steps: list[dict[str, int]]) -> dict[str, float]:
    """Each method's median µs over ``steps`` (0 where a step did not call it)."""
    keys = {k for s in steps for k in s}
    return {k: statistics.median(s.get(k, 0) / 1e3 for s in steps) for k in keys} if steps else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--skip", type=int, default=20)
    args = parser.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in sorted(args.folder.glob("*.json"))]
    cols = [(f"{r['label']} ({len(r['steps'][args.skip:])} steps)", medians(r["steps"][args.skip:])) for r in runs]
    keys = sorted({k for _, m in cols for k in m}, key=lambda k: -max(m.get(k, 0.0) for _, m in cols))
    print("| median µs per step | " + " | ".join(c for c, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{m.get(k, 0.0):.1f}" for _, m in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
