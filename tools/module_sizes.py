"""Print the sizes of a package's modules; fail only when one is over the hard limit.

``python tools/module_sizes.py [--target 600] [--limit 1000] [package_dir]`` prints the number
of modules, the median and the largest few, names every module over ``--target`` lines (the
size to split at: by noun, a family of modules becoming a package), and exits 1 naming every
module over ``--limit`` lines.  ``make architecture`` runs it on ``nsq_ha/``.
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


def check(
    package: Path, limit: int, target: int | None = None
) -> tuple[list[str], list[tuple[Path, int]]]:
    """The report lines, and the modules over ``limit`` lines (largest first).

    With a ``target``, the report names the modules over it too (without failing them).
    """
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
    ]
    if target is None:
        report.append(f"modules over {limit} lines: {_names(over)}")
    else:
        past = [(path, lines) for path, lines in ranked if lines > target]
        report.append(f"modules over {target} lines: {_names(past)}")
        report.append(f"modules over the {limit}-line limit: {_names(over)}")
    return report, over


def _names(modules: list[tuple[Path, int]]) -> str:
    return ", ".join(f"{path} ({lines})" for path, lines in modules) if modules else "none"


def main(argv: list[str] | None = None) -> int:
    """Print the report; exit 1 when a module is over the limit (not the target)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="nsq_ha", type=Path)
    parser.add_argument(
        "--target", type=int, default=600, help="name the modules over this many lines (600)"
    )
    parser.add_argument(
        "--limit", type=int, default=1000, help="fail on a module over this many lines (1000)"
    )
    args = parser.parse_args(argv)
    report, over = check(args.package, args.limit, args.target)
    print("\n".join(report))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
