"""Build the real NSQ servers into a cache outside the repository.

Two recipes are known:

* ``vanilla``: ``github.com/nsqio/nsq`` v1.3.0: ``nsqd``, ``nsqlookupd`` and the Go reference
  benchmark tools ``bench_writer`` / ``bench_reader``.
* ``fork``: ``github.com/youzan/nsq`` (the partitioned "HA" fork): ``nsqd`` and ``nsqlookupd``.

Where a recipe's servers come from, first match wins (:func:`resolve_source`):

1. ``NSQ_HA_<NAME>_BIN_DIR``: prebuilt binaries (e.g. ``NSQ_HA_FORK_BIN_DIR=/opt/nsq-ha/bin``);
   their ``--version`` output is still checked.
2. ``NSQ_HA_<NAME>_SOURCE``: the server's source, a folder (a checkout of your own) or a
   ``.tar.gz`` whose one top folder holds the module's ``go.mod``.
3. The recipe's pinned archive (:class:`PinnedArchive`, the fork only) in ``../shared/servers/``
   beside the project's checkout (or beside the working directory), checked against the sha256
   kept in the recipe; a file that does not match is an error, never silently replaced.
4. The Go module proxy.  The proxy reachable from this project's machines refuses every version
   of ``github.com/youzan/nsq`` (403), hence 2 and 3.

Each build happens in a throwaway Go module that *requires* the server module, because
``go install module@version`` refuses modules whose ``go.mod`` has ``replace`` directives (both
of ours do); the throwaway module repeats those directives.  A local source, or a recipe that
patches the source, is copied into the throwaway module, patched, and used through a directory
``replace``; the dependencies still come from the Go module proxy.

Binaries land in ``<cache>/<name>-<version>-<hash>/bin`` where ``<cache>`` is
``$NSQ_HA_CACHE_DIR`` or ``~/.cache/nsq_ha/servers``; the hash covers everything that shapes the
build (module, version, patches, flags, extra requirements, and the sha256 of a local source), so
changing a pin or the source builds anew and an unchanged one reuses the cache.  A failed build
leaves ``<name>-<version>-<hash>.failed`` with the reason, which the test plugin shows in its
skip message.  ``bin/build.json`` records what was built from what.

Run ``python -m nsq_ha.testing.build [vanilla|fork ...]`` (``make servers``) to build.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

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


class BuildError(RuntimeError):
    """A server could not be built (or prebuilt binaries did not check out)."""


@dataclass(frozen=True, slots=True)
class SourcePatch:
    """Replace ``old`` by ``new`` (exactly once) in ``path`` of the module source."""

    path: str
    old: str
    new: str
    why: str


@dataclass(frozen=True, slots=True)
class PinnedArchive:
    """A source archive of the pinned revision, looked for in ``../shared/servers/``."""

    filename: str
    sha256: str
    #: the git commit the archive holds (docker/ clones it when no archive is given)
    commit: str = ""


@dataclass(frozen=True, slots=True)
class ServerRecipe:
    """Everything that decides what a server build produces."""

    name: str
    module: str
    version: str
    #: binary name -> package path inside the module
    programs: dict[str, str]
    #: the string ``<binary> --version`` must print for the main daemons
    expected_version: str
    extra_requires: tuple[tuple[str, str], ...] = ()
    patches: tuple[SourcePatch, ...] = ()
    ldflags: str = ""
    #: Go version written in the throwaway module (the machine's toolchain is used, >= this)
    go_directive: str = "1.22"
    #: the pinned revision's source archive, when the module proxy cannot be relied on
    archive: PinnedArchive | None = field(default=None, compare=False)

    def key(self, source_digest: str = "") -> str:
        """A short hash of the recipe and the source: the cache directory changes with either.

        ``source_digest`` is the sha256 of a local source ("" for the module proxy, whose
        content the version pins).  Where the pinned archive lives is not part of the key.
        """
        recipe = asdict(self)
        recipe.pop("archive")
        blob = json.dumps({"recipe": recipe, "source": source_digest}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def dirname(self, source_digest: str = "") -> str:
        """The cache folder of this recipe built from the source with that digest."""
        return f"{self.name}-{self.version}-{self.key(source_digest)}"

    @property
    def env_prefix(self) -> str:
        """``NSQ_HA_<NAME>``: the prefix of this recipe's ``_BIN_DIR`` / ``_SOURCE`` variables."""
        return f"NSQ_HA_{self.name.upper()}"


VANILLA = ServerRecipe(
    name="vanilla",
    module="github.com/nsqio/nsq",
    version="v1.3.0",
    programs={
        "nsqd": "apps/nsqd",
        "nsqlookupd": "apps/nsqlookupd",
        "bench_writer": "bench/bench_writer",
        "bench_reader": "bench/bench_reader",
    },
    expected_version="v1.3.0",
)

# The fork is pinned to master at b16e68eb (2024-04-11), which reports 0.3.7-HA.1.13.0, rather
# than the newest tag v0.3.7-HA.1.12.7: PROTOCOL.md and every golden recording in this project
# were verified against that exact revision, so tests and reference agree byte for byte.
FORK = ServerRecipe(
    name="fork",
    module="github.com/youzan/nsq",
    version="v0.3.7-HA.1.12.7.0.20240411024313-b16e68ebed1d",
    programs={"nsqd": "apps/nsqd", "nsqlookupd": "apps/nsqlookupd"},
    expected_version="0.3.7-HA.1.13.0",
    # reflect2 < 1.0.2 (required by the fork through json-iterator) crashes at start-up on
    # Go >= 1.18; the minimum-version selection picks this one instead.
    extra_requires=(("github.com/modern-go/reflect2", "v1.0.2"),),
    patches=(
        SourcePatch(
            path="nsqdserver/nsqd_server.go",
            old="reservedFDNum = 50000",
            new="reservedFDNum = 5000",
            why=(
                "nsqd refuses to start unless the soft RLIMIT_NOFILE is >= 2*reservedFDNum "
                "(100000); test machines often have a hard limit of 20000, so the local build "
                "lowers the reserve to 5000 (needs 10000 open files)"
            ),
        ),
    ),
    # Go >= 1.23 refuses old //go:linkname pulls of runtime internals used by old dependencies.
    ldflags="-checklinkname=0",
    # The module proxy refuses github.com/youzan/nsq (403), so the project keeps the pinned
    # revision's source, unmodified, in ../shared/servers/ (its README gives this sha256).
    archive=PinnedArchive(
        filename="youzan-nsq-b16e68eb.tar.gz",
        sha256="bc0fa7daee260c382df00e50317c9cd64e256fe064024cf74976231e43e46451",
        commit="b16e68ebed1d63251b09c1390524ad95f4ca6459",
    ),
)

RECIPES: dict[str, ServerRecipe] = {r.name: r for r in (VANILLA, FORK)}


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


def _project_root() -> Path:
    """The checkout this package runs from (an editable install), or the working directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def pinned_archive_candidates(recipe: ServerRecipe) -> list[Path]:
    """Where the recipe's pinned archive is looked for: ``../shared/servers/`` beside the
    project's checkout, then beside the working directory."""
    if recipe.archive is None:
        return []
    roots = [_project_root(), Path.cwd()]
    out: list[Path] = []
    for root in roots:
        path = root.resolve().parent / "shared" / "servers" / recipe.archive.filename
        if path not in out:
            out.append(path)
    return out


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
    if recipe.archive is not None:
        for path in pinned_archive_candidates(recipe):
            if not path.is_file():
                continue
            digest = _sha256_file(path)
            if digest != recipe.archive.sha256:
                raise BuildError(
                    f"{path} has sha256 {digest}, but the {recipe.name} recipe pins "
                    f"{recipe.archive.sha256}: replace the file, or name another source with "
                    f"{prefix}_SOURCE"
                )
            return ServerSource("pinned_archive", str(path), digest)
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


def _check_version(recipe: ServerRecipe, binary: Path) -> None:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise BuildError(f"cannot run {binary}: {exc}") from exc
    text = (out.stdout + out.stderr).strip()
    if recipe.expected_version not in text:
        raise BuildError(
            f"{binary} --version printed {text!r}; expected it to contain "
            f"{recipe.expected_version!r}"
        )


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


def _run(argv: Sequence[str], cwd: Path, env: dict[str, str], what: str) -> str:
    log.info("%s: %s", what, " ".join(argv))
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=mod").strip()
    return env


def _download(recipe: ServerRecipe, work: Path, env: dict[str, str]) -> dict[str, str]:
    """``go mod download`` the server module; returns its JSON (Dir, GoMod, ...)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{recipe.module}@{recipe.version}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info: dict[str, str] = json.loads(out.stdout) if out.stdout.strip() else {}
    except json.JSONDecodeError:
        info = {}
    if out.returncode != 0 or "Error" in info or "Dir" not in info:
        reason = info.get("Error") or (out.stderr.strip() or out.stdout.strip())
        raise BuildError(
            f"the Go module proxy did not provide {recipe.module}@{recipe.version}: {reason}\n"
            + how_to_get(recipe)
        )
    return info


def _unpack(archive: Path, dest: Path) -> Path:
    """Unpack a source ``.tar.gz`` into ``dest``; returns the folder holding its ``go.mod``."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # "data": no absolute paths, no links out of dest, no device files.
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise BuildError(f"cannot unpack {archive}: {exc}") from exc
    if (dest / "go.mod").is_file():
        return dest
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) == 1 and (tops[0] / "go.mod").is_file():
        return tops[0]
    raise BuildError(f"{archive} has no go.mod at its top or in its one top folder")


def _module_path(gomod: Path) -> str:
    for line in gomod.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "module":
            return words[1].strip('"')
    raise BuildError(f"{gomod} names no module")


def _module_replaces(gomod: str, work: Path, env: dict[str, str]) -> list[str]:
    """The server module's own ``replace`` directives, as ``go mod edit -replace`` arguments."""
    data = json.loads(_run(["go", "mod", "edit", "-json", gomod], work, env, "read go.mod"))
    args = []
    for rep in data.get("Replace") or []:
        old, new = rep["Old"], rep["New"]
        lhs = old["Path"] + (f"@{old['Version']}" if old.get("Version") else "")
        rhs = new["Path"] + (f"@{new['Version']}" if new.get("Version") else "")
        args.append(f"-replace={lhs}={rhs}")
    return args


def _patched_copy(recipe: ServerRecipe, src_dir: Path, dest: Path) -> None:
    shutil.copytree(src_dir, dest, ignore=shutil.ignore_patterns(".git"))
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | 0o200)
    dest.chmod(dest.stat().st_mode | 0o200)
    for patch in recipe.patches:
        target = dest / patch.path
        text = target.read_text()
        if text.count(patch.old) != 1:
            raise BuildError(
                f"patch for {patch.path} expects {patch.old!r} exactly once, found "
                f"{text.count(patch.old)} times: the pinned source changed; update the recipe"
            )
        target.write_text(text.replace(patch.old, patch.new))
        log.info("patched %s: %s", patch.path, patch.why)


def _source_tree(
    recipe: ServerRecipe, source: ServerSource, work: Path, env: dict[str, str]
) -> Path:
    """The folder holding the server module's source (and ``go.mod``) for this build."""
    if source.kind == "proxy":
        return Path(_download(recipe, work, env)["Dir"])
    if source.kind == "folder":
        tree = Path(source.location)
    else:  # archive, pinned_archive
        tree = _unpack(Path(source.location), work / "unpacked")
    module = _module_path(tree / "go.mod")
    if module != recipe.module:
        raise BuildError(f"{source.describe()} is module {module!r}, not {recipe.module!r}")
    return tree


def _build(recipe: ServerRecipe, source: ServerSource, final: Path) -> None:
    if shutil.which("go") is None:
        raise BuildError(
            "Go is not on PATH (the servers are built with the machine's Go toolchain)\n"
            + how_to_get(recipe)
        )
    root = cache_root()
    work = root / f".build-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = _go_env()
    log.info("%s: building from %s", recipe.name, source.describe())
    try:
        (work / "go.mod").write_text(f"module nsqhabuild\n\ngo {recipe.go_directive}\n")
        tree = _source_tree(recipe, source, work, env)
        edits = [f"-require={recipe.module}@{recipe.version}"]
        edits += [f"-require={mod}@{ver}" for mod, ver in recipe.extra_requires]
        edits += _module_replaces(str(tree / "go.mod"), work, env)
        if recipe.patches or source.kind != "proxy":
            _patched_copy(recipe, tree, work / "src")
            edits.append(f"-replace={recipe.module}=./src")
        _run(["go", "mod", "edit", *edits], work, env, "write throwaway go.mod")
        argv = ["go", "build", "-trimpath", "-o", str(work / "bin") + "/"]
        if recipe.ldflags:
            argv.append(f"-ldflags={recipe.ldflags}")
        argv += [f"{recipe.module}/{pkg}" for pkg in recipe.programs.values()]
        started = time.monotonic()
        _run(argv, work, env, f"go build {recipe.name}")
        for prog in ("nsqd", "nsqlookupd"):
            _check_version(recipe, work / "bin" / prog)
        go_version = _run(["go", "version"], work, env, "go version").strip()
        stamp = {
            "recipe": asdict(recipe),
            "source": asdict(source),
            "go": go_version,
            "build_seconds": round(time.monotonic() - started, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (work / "bin" / "build.json").write_text(json.dumps(stamp, indent=2) + "\n")
        final.mkdir(parents=True, exist_ok=True)
        os.replace(work / "bin", final / "bin")
    finally:
        shutil.rmtree(work, ignore_errors=True)


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


def ensure_built(recipe: ServerRecipe) -> ServerBinaries:
    """Return the recipe's binaries, building them first when the cache lacks them.

    Raises :class:`BuildError` with the reason (also recorded for :func:`last_failure`).
    """
    source = resolve_source(recipe)
    if source.kind == "bin_dir":
        found = _complete(recipe, Path(source.location))
        if found is None:
            raise BuildError(
                f"{recipe.env_prefix}_BIN_DIR={source.location} lacks one of "
                f"{sorted(recipe.programs)}"
            )
        for prog in ("nsqd", "nsqlookupd"):
            _check_version(recipe, found.path(prog))
        return found
    with _lock(recipe):
        final = cache_root() / recipe.dirname(source.digest)
        found = _complete(recipe, final / "bin")
        if found is not None:
            return found
        failed = _failure_file(recipe, source)
        try:
            _build(recipe, source, final)
        except BuildError as exc:
            failed.write_text(f"building from {source.describe()}: {exc}\n")
            raise
        failed.unlink(missing_ok=True)
        found = _complete(recipe, final / "bin")
        if found is None:  # pragma: no cover - _build either fills the dir or raises
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
