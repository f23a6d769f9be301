"""Build the real NSQ servers into a cache outside the repository.

The parts, each with one job:

* :mod:`nsq_ha.testing.recipes`: what is built (:data:`VANILLA`, :data:`FORK`, their pins and
  source patch) and :class:`BuildError`.
* :mod:`nsq_ha.testing.sources`: where a recipe's servers come from on this machine, first match
  wins: ``NSQ_HA_<NAME>_BIN_DIR`` (prebuilt, version-checked), ``NSQ_HA_<NAME>_SOURCE`` (a
  folder or ``.tar.gz``), the pinned archive in ``../shared/servers/`` (sha256-checked), the Go
  module proxy (:func:`resolve_source`, :func:`how_to_get`).
* :mod:`nsq_ha.testing.gobuild`: how a source becomes binaries (a throwaway Go module that
  requires the server module and repeats its ``replace`` directives; patches applied to a copy).
* this module: the cache.  :func:`ensure_built` builds once per recipe and source under a file
  lock; :func:`find_built` and :func:`last_failure` only look.

Binaries land in ``<cache>/<name>-<version>-<hash>/bin`` where ``<cache>`` is
``$NSQ_HA_CACHE_DIR`` or ``~/.cache/nsq_ha/servers``; the hash covers everything that shapes the
build (module, version, patches, flags, extra requirements, and the sha256 of a local source), so
changing a pin or the source builds anew and an unchanged one reuses the cache.  A failed build
leaves ``<name>-<version>-<hash>.failed`` with the reason, which the test plugin shows in its
skip message.  ``bin/build.json`` records what was built from what.

Every name of the parts that callers used is importable from here too.

Run ``python -m nsq_ha.testing.build [vanilla|fork ...]`` (``make servers``) to build.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nsq_ha.testing.gobuild import DAEMONS, build_servers, check_version
from nsq_ha.testing.recipes import (
    FORK,
    RECIPES,
    VANILLA,
    BuildError,
    PinnedArchive,
    ServerRecipe,
    SourcePatch,
)
from nsq_ha.testing.sources import (
    ServerSource,
    how_to_get,
    pinned_archive_candidates,
    resolve_source,
)

__all__ = [
    "FORK",
    "RECIPES",
    "VANILLA",
    "BuildError",
    "PinnedArchive",
    "ServerBinaries",
    "ServerRecipe",
    "ServerSource",
    "SourcePatch",
    "cache_root",
    "ensure_built",
    "find_built",
    "how_to_get",
    "last_failure",
    "pinned_archive_candidates",
    "resolve_source",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerBinaries:
    """Paths of one recipe's built programs."""

    recipe: ServerRecipe
    bin_dir: Path

    def path(self, program: str) -> Path:
        if program not in self.recipe.programs:
            raise KeyError(f"{self.recipe.name} build has no program {program!r}")
        return self.bin_dir / program

    @property
    def nsqd(self) -> Path:
        return self.path("nsqd")

    @property
    def nsqlookupd(self) -> Path:
        return self.path("nsqlookupd")


def cache_root() -> Path:
    """Where builds are cached: ``$NSQ_HA_CACHE_DIR`` or ``~/.cache/nsq_ha/servers``."""
    env = os.environ.get("NSQ_HA_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "nsq_ha" / "servers"


def _failure_file(recipe: ServerRecipe, source: ServerSource) -> Path:
    return cache_root() / f"{recipe.dirname(source.digest)}.failed"


def last_failure(recipe: ServerRecipe) -> str | None:
    """The reason the last build of this exact recipe and source failed, if it did."""
    try:
        source = resolve_source(recipe)
    except BuildError as exc:
        return str(exc)
    with contextlib.suppress(OSError):
        return _failure_file(recipe, source).read_text().strip() or None
    return None


def _bin_dir(recipe: ServerRecipe, source: ServerSource) -> Path:
    if source.kind == "bin_dir":
        return Path(source.location)
    return cache_root() / recipe.dirname(source.digest) / "bin"


def _complete(recipe: ServerRecipe, bin_dir: Path) -> ServerBinaries | None:
    if all((bin_dir / prog).is_file() for prog in recipe.programs):
        return ServerBinaries(recipe, bin_dir)
    return None


def find_built(recipe: ServerRecipe) -> ServerBinaries | None:
    """The recipe's binaries for this machine's source if they exist; no building.

    Returns None when they are not built yet, or when the source cannot be resolved
    (:func:`last_failure` then says why).
    """
    try:
        source = resolve_source(recipe)
    except BuildError:
        return None
    return _complete(recipe, _bin_dir(recipe, source))


@contextlib.contextmanager
def _lock(recipe: ServerRecipe) -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".lock-{recipe.name}").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prebuilt(recipe: ServerRecipe, source: ServerSource) -> ServerBinaries:
    """The binaries ``NSQ_HA_<NAME>_BIN_DIR`` names, complete and version-checked."""
    found = _complete(recipe, Path(source.location))
    if found is None:
        raise BuildError(
            f"{recipe.env_prefix}_BIN_DIR={source.location} lacks one of {sorted(recipe.programs)}"
        )
    for prog in DAEMONS:
        check_version(recipe, found.path(prog))
    return found


def ensure_built(recipe: ServerRecipe) -> ServerBinaries:
    """Return the recipe's binaries, building them first when the cache lacks them.

    Raises :class:`BuildError` with the reason (also recorded for :func:`last_failure`).
    """
    source = resolve_source(recipe)
    if source.kind == "bin_dir":
        return _prebuilt(recipe, source)
    with _lock(recipe):
        final = cache_root() / recipe.dirname(source.digest)
        found = _complete(recipe, final / "bin")
        if found is not None:
            return found
        failed = _failure_file(recipe, source)
        try:
            build_servers(recipe, source, final)
        except BuildError as exc:
            failed.write_text(f"building from {source.describe()}: {exc}\n")
            raise
        failed.unlink(missing_ok=True)
        found = _complete(recipe, final / "bin")
        if found is None:  # pragma: no cover - build_servers either fills the dir or raises
            raise BuildError(f"{recipe.name} build finished but left no binaries")
        return found


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the named recipes (all by default); exit 1 if any failed."""
    parser = argparse.ArgumentParser(
        prog="python -m nsq_ha.testing.build",
        description="Build the real NSQ servers into the cache (sources: see the module doc).",
    )
    parser.add_argument("names", nargs="*", help=f"recipes to build: {', '.join(RECIPES)} (all)")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="exit 0 even if a build fails (tests needing it are then skipped or fail)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    failed = 0
    unknown = sorted(set(args.names) - set(RECIPES))
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; known: {sorted(RECIPES)}")
    for name in args.names or list(RECIPES):
        recipe = RECIPES[name]
        started = time.monotonic()
        try:
            source = resolve_source(recipe)
            bins = ensure_built(recipe)
        except BuildError as exc:
            failed += 1
            print(f"[servers] {name}: NOT BUILT: {exc}", file=sys.stderr)
            continue
        took = time.monotonic() - started
        print(f"[servers] {name}: {bins.bin_dir} ({took:.1f}s), from {source.describe()}")
    return 0 if args.keep_going or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
