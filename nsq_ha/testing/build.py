"""Build the real NSQ servers from the Go module proxy into a cache outside the repository.

Two recipes are known:

* ``vanilla``: ``github.com/nsqio/nsq`` v1.3.0: ``nsqd``, ``nsqlookupd`` and the Go reference
  benchmark tools ``bench_writer`` / ``bench_reader``.
* ``fork``: ``github.com/youzan/nsq`` (the partitioned "HA" fork): ``nsqd`` and ``nsqlookupd``.

Each build happens in a throwaway Go module that *requires* the server module, because
``go install module@version`` refuses modules whose ``go.mod`` has ``replace`` directives (both
of ours do); the throwaway module repeats those directives.  When a recipe patches the source,
the module is copied out of the module cache, patched, and used through a directory ``replace``.

Binaries land in ``<cache>/<name>-<version>-<recipe hash>/bin`` where ``<cache>`` is
``$NSQ_HA_CACHE_DIR`` or ``~/.cache/nsq_ha/servers``; the hash covers everything that shapes the
build (module, version, patches, flags, extra requirements), so changing a pin builds anew and an
unchanged pin reuses the cache.  A failed build leaves ``<name>-<version>-<hash>.failed`` with the
reason, which the test plugin shows in its skip message.

Prebuilt binaries can be used instead with ``NSQ_HA_<NAME>_BIN_DIR`` (e.g.
``NSQ_HA_FORK_BIN_DIR=/opt/nsq-ha/bin``); their ``--version`` output is still checked.

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
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "FORK",
    "RECIPES",
    "VANILLA",
    "BuildError",
    "ServerBinaries",
    "ServerRecipe",
    "SourcePatch",
    "cache_root",
    "ensure_built",
    "find_built",
    "last_failure",
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

    def key(self) -> str:
        """A short hash of the recipe: the cache directory changes whenever the recipe does."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.version}-{self.key()}"


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


def _override_dir(recipe: ServerRecipe) -> Path | None:
    env = os.environ.get(f"NSQ_HA_{recipe.name.upper()}_BIN_DIR")
    return Path(env).expanduser() if env else None


def _failure_file(recipe: ServerRecipe) -> Path:
    return cache_root() / f"{recipe.dirname}.failed"


def last_failure(recipe: ServerRecipe) -> str | None:
    """The reason the last build of this exact recipe failed, if it did."""
    with contextlib.suppress(OSError):
        return _failure_file(recipe).read_text().strip() or None
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


def find_built(recipe: ServerRecipe) -> ServerBinaries | None:
    """The recipe's binaries if they exist (override dir first, then the cache); no building."""
    override = _override_dir(recipe)
    candidates = [override] if override else [cache_root() / recipe.dirname / "bin"]
    for bin_dir in candidates:
        if all((bin_dir / prog).is_file() for prog in recipe.programs):
            return ServerBinaries(recipe, bin_dir)
    return None


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
            f"the Go module proxy did not provide {recipe.module}@{recipe.version}: {reason}"
        )
    return info


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
    shutil.copytree(src_dir, dest)
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


def _build(recipe: ServerRecipe, final: Path) -> None:
    if shutil.which("go") is None:
        raise BuildError("Go is not on PATH (the servers are built from the Go module proxy)")
    root = cache_root()
    work = root / f".build-{recipe.dirname}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = _go_env()
    try:
        (work / "go.mod").write_text(f"module nsqhabuild\n\ngo {recipe.go_directive}\n")
        info = _download(recipe, work, env)
        edits = [f"-require={recipe.module}@{recipe.version}"]
        edits += [f"-require={mod}@{ver}" for mod, ver in recipe.extra_requires]
        edits += _module_replaces(info["GoMod"], work, env)
        if recipe.patches:
            _patched_copy(recipe, Path(info["Dir"]), work / "src")
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
    override = _override_dir(recipe)
    if override is not None:
        found = find_built(recipe)
        if found is None:
            raise BuildError(
                f"NSQ_HA_{recipe.name.upper()}_BIN_DIR={override} lacks one of "
                f"{sorted(recipe.programs)}"
            )
        for prog in ("nsqd", "nsqlookupd"):
            _check_version(recipe, found.path(prog))
        return found
    with _lock(recipe):
        found = find_built(recipe)
        if found is not None:
            return found
        failed = _failure_file(recipe)
        try:
            _build(recipe, cache_root() / recipe.dirname)
        except BuildError as exc:
            failed.write_text(str(exc) + "\n")
            raise
        failed.unlink(missing_ok=True)
        found = find_built(recipe)
        if found is None:  # pragma: no cover - _build either fills the dir or raises
            raise BuildError(f"{recipe.name} build finished but left no binaries")
        return found


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the named recipes (all by default); exit 1 if any failed."""
    parser = argparse.ArgumentParser(
        prog="python -m nsq_ha.testing.build",
        description="Build the real NSQ servers from the Go module proxy into the cache.",
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
            bins = ensure_built(recipe)
        except BuildError as exc:
            failed += 1
            print(f"[servers] {name}: NOT BUILT: {exc}", file=sys.stderr)
            continue
        took = time.monotonic() - started
        print(f"[servers] {name}: {bins.bin_dir} ({took:.1f}s)")
    return 0 if args.keep_going or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
