"""Where a recipe's servers come from on this machine; the first match wins.

1. ``NSQ_HA_<NAME>_BIN_DIR``: prebuilt binaries (e.g. ``NSQ_HA_FORK_BIN_DIR=/opt/nsq-ha/bin``);
   their ``--version`` output is still checked.
2. ``NSQ_HA_<NAME>_SOURCE``: the server's source, a folder (a checkout of your own) or a
   ``.tar.gz`` whose one top folder holds the module's ``go.mod``.
3. The recipe's pinned archive (:class:`~nsq_ha.testing.recipes.PinnedArchive`, the fork only)
   in ``../shared/servers/`` beside the project's checkout (or beside the working directory),
   checked against the sha256 kept in the recipe; a file that does not match is an error, never
   silently replaced.
4. The Go module proxy.  The proxy reachable from this project's machines refuses every version
   of ``github.com/youzan/nsq`` (403), hence 2 and 3.

:func:`resolve_source` answers with a :class:`ServerSource` (kind, location, sha256 of a local
source); it reads the environment and the file system and builds nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nsq_ha.testing.recipes import BuildError, ServerRecipe

__all__ = [
    "ServerSource",
    "SourceKind",
    "how_to_get",
    "pinned_archive_candidates",
    "project_root",
    "resolve_source",
]

SourceKind = Literal["bin_dir", "folder", "archive", "pinned_archive", "proxy"]


@dataclass(frozen=True, slots=True)
class ServerSource:
    """Where one recipe's servers come from on this machine (see :func:`resolve_source`)."""

    kind: SourceKind
    #: the folder or file (``bin_dir``, ``folder``, ``archive``, ``pinned_archive``); the
    #: ``module@version`` for ``proxy``
    location: str
    #: sha256 of the archive file, or of the folder's files; "" for ``proxy`` and ``bin_dir``
    digest: str = ""

    def describe(self) -> str:
        """One line for logs and ``build.json``: what the servers are built from."""
        what = {
            "bin_dir": "prebuilt binaries in",
            "folder": "source folder",
            "archive": "source archive",
            "pinned_archive": "pinned source archive",
            "proxy": "the Go module proxy:",
        }[self.kind]
        digest = f" (sha256 {self.digest[:16]}...)" if self.digest else ""
        return f"{what} {self.location}{digest}"


def _sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_tree(root: Path) -> str:
    """A digest of a source folder: every file's relative path and content (``.git`` skipped)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(_sha256_file(path).encode())
    return digest.hexdigest()


def project_root() -> Path:
    """The checkout this package runs from (an editable install), or the working directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def pinned_archive_candidates(recipe: ServerRecipe) -> list[Path]:
    """Where the recipe's pinned archive is looked for: ``../shared/servers/`` beside the
    project's checkout, then beside the working directory."""
    if recipe.archive is None:
        return []
    roots = [project_root(), Path.cwd()]
    out: list[Path] = []
    for root in roots:
        path = root.resolve().parent / "shared" / "servers" / recipe.archive.filename
        if path not in out:
            out.append(path)
    return out


def _named_source(recipe: ServerRecipe, named: str) -> ServerSource:
    """The source ``NSQ_HA_<NAME>_SOURCE`` names: a module folder or a ``.tar.gz``."""
    prefix = recipe.env_prefix
    path = Path(named).expanduser().resolve()
    if path.is_dir():
        if not (path / "go.mod").is_file():
            raise BuildError(f"{prefix}_SOURCE={named} is a folder without a go.mod")
        return ServerSource("folder", str(path), _sha256_tree(path))
    if path.is_file():
        if not path.name.endswith((".tar.gz", ".tgz")):
            raise BuildError(f"{prefix}_SOURCE={named} is neither a folder nor a .tar.gz")
        return ServerSource("archive", str(path), _sha256_file(path))
    raise BuildError(f"{prefix}_SOURCE={named} does not exist")


def _pinned_source(recipe: ServerRecipe) -> ServerSource | None:
    """The pinned archive where it is found (sha256-checked), else None."""
    if recipe.archive is None:
        return None
    for path in pinned_archive_candidates(recipe):
        if not path.is_file():
            continue
        digest = _sha256_file(path)
        if digest != recipe.archive.sha256:
            raise BuildError(
                f"{path} has sha256 {digest}, but the {recipe.name} recipe pins "
                f"{recipe.archive.sha256}: replace the file, or name another source with "
                f"{recipe.env_prefix}_SOURCE"
            )
        return ServerSource("pinned_archive", str(path), digest)
    return None


def resolve_source(recipe: ServerRecipe) -> ServerSource:
    """Where ``recipe``'s servers come from on this machine; the first that applies wins.

    ``NSQ_HA_<NAME>_BIN_DIR``, then ``NSQ_HA_<NAME>_SOURCE`` (a folder or a ``.tar.gz``), then
    the pinned archive in ``../shared/servers/`` (sha256-checked), then the Go module proxy.
    Raises :class:`BuildError` when a named source does not exist or the pinned archive does
    not match its sha256.
    """
    prefix = recipe.env_prefix
    bin_dir = os.environ.get(f"{prefix}_BIN_DIR")
    if bin_dir:
        return ServerSource("bin_dir", str(Path(bin_dir).expanduser()))
    named = os.environ.get(f"{prefix}_SOURCE")
    if named:
        return _named_source(recipe, named)
    pinned = _pinned_source(recipe)
    if pinned is not None:
        return pinned
    return ServerSource("proxy", f"{recipe.module}@{recipe.version}")


def how_to_get(recipe: ServerRecipe) -> str:
    """Every way to provide ``recipe``'s servers, for skip messages and errors."""
    prefix = recipe.env_prefix
    ways = [
        f"{prefix}_BIN_DIR=<folder with {', '.join(sorted(recipe.programs))}>",
        f"{prefix}_SOURCE=<source folder or .tar.gz of {recipe.module}>",
    ]
    if recipe.archive is not None:
        where = " or ".join(str(p) for p in pinned_archive_candidates(recipe))
        ways.append(f"the pinned archive {recipe.archive.filename} at {where}")
    ways.append(f"the Go module proxy ({recipe.module}@{recipe.version})")
    return (
        f"ways to get the {recipe.name} servers, first match wins: "
        + "; ".join(f"({i}) {way}" for i, way in enumerate(ways, 1))
        + "; then run `make servers` (needs Go on PATH)"
    )
