"""Fail when a module of the package is over the size limit; print the sizes' summary.

``python tools/module_sizes.py [--limit 600] [package_dir]`` prints the number of modules, the
median and the largest few, and exits 1 naming every module over ``--limit`` lines. ``make
test`` runs it on ``nsq_ha/`` (issue 21: a module over 600 lines is split by its objects).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def line_counts(package: Path) -> dict[Path, int]:
    """Lines of every ``.py`` file under ``package``, by path relative to its parent."""
    return {
        path.relative_to(package.parent): len(path.read_bytes().splitlines())
        for path in sorted(package.rglob("*.py"))
    }


def check(package: Path, limit: int) -> tuple[list[str], list[tuple[Path, int]]]:
    """The report lines, and the modules over ``limit`` lines (largest first)."""
    counts = line_counts(package)
    if not counts:
        raise SystemExit(f"module_sizes: no Python module under {package}")
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    over = [(path, lines) for path, lines in ranked if lines > limit]
    sizes = list(counts.values())
    report = [
        f"module sizes: {len(sizes)} modules in {package.name}/, median "
        f"{statistics.median(sizes):g} lines, largest "
        + ", ".join(f"{path} {lines}" for path, lines in ranked[:3]),
        f"modules over {limit} lines: "
        + (", ".join(f"{path} ({lines})" for path, lines in over) if over else "none"),
    ]
    return report, over


def main(argv: list[str] | None = None) -> int:
    """Print the report; exit 1 when a module is over the limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="nsq_ha", type=Path)
    parser.add_argument("--limit", type=int, default=600)
    args = parser.parse_args(argv)
    report, over = check(args.package, args.limit)
    print("\n".join(report))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
