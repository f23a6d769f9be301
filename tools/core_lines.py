"""Lines of the client core: every ``nsq_ha`` module that importing the client loads.

``python tools/core_lines.py`` imports ``nsq_ha, nsq_ha.producer, nsq_ha.consumer, nsq_ha.sync``
in a fresh interpreter (this one's, from the checkout), prints the lines of every ``nsq_ha``
file that import loaded, largest first, and the total; then the modules of the other products
it must not load (``h11``, the embedded broker, the server builder and pytest plugin, the
benchmark, the command line, the Spark source) and exits 1 if there is one.  ``--limit N``
also fails when the total is over ``N`` lines.  ``tests/harness/test_core_imports.py`` runs
the same import; ``make architecture`` runs ``--summary``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CORE_IMPORT = "import nsq_ha, nsq_ha.producer, nsq_ha.consumer, nsq_ha.sync"

# What the client core never loads: the embedded broker's HTTP library and the other products.
FORBIDDEN = (
    "h11",
    "nsq_ha.devcluster",
    "nsq_ha.testing",
    "nsq_ha.bench",
    "nsq_ha.cli",
    "nsq_ha.spark",
)

_REPORT_MODULES = (
    "import json, sys\n"
    "print(json.dumps({name: getattr(module, '__file__', None)"
    " for name, module in list(sys.modules.items())}))"
)


def loaded_modules(statement: str = CORE_IMPORT, *, timeout: float = 60.0) -> dict[str, str | None]:
    """Every module in ``sys.modules`` after ``statement`` in a fresh interpreter, with its file.

    The interpreter is this one, started in the checkout, so that ``nsq_ha`` is the checkout's.
    """
    out = subprocess.run(
        [sys.executable, "-c", f"{statement}\n{_REPORT_MODULES}"],
        cwd=ROOT,
        # the sources' lines: a compiled build's modules are extension modules (.so files)
        env={**os.environ, "NSQ_HA_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"core_lines: {statement!r} failed:\n{out.stderr.strip()}")
    modules: dict[str, str | None] = json.loads(out.stdout.splitlines()[-1])
    return modules


def forbidden(modules: dict[str, str | None]) -> list[str]:
    """The loaded modules that belong to ``FORBIDDEN`` (a name or a submodule of one)."""
    return sorted(
        name
        for name in modules
        if any(name == prefix or name.startswith(prefix + ".") for prefix in FORBIDDEN)
    )


def core_lines(modules: dict[str, str | None]) -> dict[str, int]:
    """Lines of every loaded ``nsq_ha`` source file, by path relative to the checkout."""
    counts: dict[str, int] = {}
    for name, file in modules.items():
        if file is None or not (name == "nsq_ha" or name.startswith("nsq_ha.")):
            continue
        path = Path(file).resolve()
        label = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        counts[label] = len(path.read_bytes().splitlines())
    return counts


def report(counts: dict[str, int], extra: list[str], *, files: int | None = None) -> list[str]:
    """The lines ``main`` prints: one per file, largest first (the first ``files`` of them when
    given), the total, and the modules of other products that were loaded."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:files]
    width = max((len(path) for path, _ in ranked), default=0)
    lines = [f"{path:<{width}} {count:>6}" for path, count in ranked]
    lines.append(f"client core: {len(counts)} files, {sum(counts.values())} lines ({CORE_IMPORT})")
    lines.append("modules of the other products loaded: " + (", ".join(extra) or "none"))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report; exit 1 if the core loads another product's module (or is too big)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="fail over this many lines")
    parser.add_argument("--summary", action="store_true", help="only the 5 largest files")
    args = parser.parse_args(argv)
    modules = loaded_modules()
    counts = core_lines(modules)
    extra = forbidden(modules)
    print("\n".join(report(counts, extra, files=5 if args.summary else None)))
    total = sum(counts.values())
    if args.limit is not None and total > args.limit:
        print(f"client core: {total} lines is over the limit of {args.limit}")
        return 1
    return 1 if extra else 0


if __name__ == "__main__":
    sys.exit(main())
