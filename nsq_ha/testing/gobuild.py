"""The Go build recipe: a server from a :class:`~nsq_ha.testing.sources.ServerSource` into a
``bin`` folder.

Each build happens in a throwaway Go module (:class:`ThrowawayModule`) that *requires* the
server module, because ``go install module@version`` refuses modules whose ``go.mod`` has
``replace`` directives (both of ours do); the throwaway module repeats those directives.  A
local source, or a recipe that patches the source, is copied into the throwaway module, patched
(:func:`patched_copy`), and used through a directory ``replace``; the dependencies still come
from the Go module proxy.  ``bin/build.json`` records what was built from what.

:func:`build_servers` is the one entry point; it knows nothing of the cache (the caller names
the final folder) and raises :class:`~nsq_ha.testing.recipes.BuildError` with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from nsq_ha.testing.recipes import BuildError, ServerRecipe
from nsq_ha.testing.sources import ServerSource, how_to_get

__all__ = ["ThrowawayModule", "build_servers", "check_version", "patched_copy", "unpack"]

log = logging.getLogger(__name__)

#: the daemons whose ``--version`` must name the recipe's expected version
DAEMONS = ("nsqd", "nsqlookupd")


def check_version(recipe: ServerRecipe, binary: Path) -> None:
    """Raise :class:`BuildError` unless ``binary --version`` names the recipe's version."""
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


def unpack(archive: Path, dest: Path) -> Path:
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


def patched_copy(recipe: ServerRecipe, src_dir: Path, dest: Path) -> None:
    """Copy a module source to ``dest`` (writable, ``.git`` left out) and apply the patches.

    A patch whose ``old`` text is not found exactly once raises :class:`BuildError`: the
    pinned source changed and the recipe must follow.
    """
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


def _module_path(gomod: Path) -> str:
    for line in gomod.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "module":
            return words[1].strip('"')
    raise BuildError(f"{gomod} names no module")


class ThrowawayModule:
    """A scratch Go module in ``work`` where every ``go`` command of one build runs.

    The environment pins the local toolchain (``GOTOOLCHAIN=local``) and lets ``go`` edit
    ``go.mod`` (``-mod=mod``).
    """

    def __init__(self, work: Path, go_directive: str) -> None:
        self.work = work
        self.env = dict(os.environ)
        self.env.setdefault("GOTOOLCHAIN", "local")
        self.env["GOFLAGS"] = (self.env.get("GOFLAGS", "") + " -mod=mod").strip()
        (work / "go.mod").write_text(f"module nsqhabuild\n\ngo {go_directive}\n")

    def __repr__(self) -> str:
        return f"<ThrowawayModule {self.work}>"

    def run(self, argv: Sequence[str], what: str) -> str:
        """Run a command in the module; its stdout, or :class:`BuildError` with the tail."""
        log.info("%s: %s", what, " ".join(argv))
        proc = subprocess.run(
            list(argv), cwd=self.work, env=self.env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
        return proc.stdout

    def download(self, recipe: ServerRecipe) -> Path:
        """``go mod download`` the server module; the folder of its source."""
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{recipe.module}@{recipe.version}"],
            cwd=self.work,
            env=self.env,
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
                f"the Go module proxy did not provide {recipe.module}@{recipe.version}: "
                f"{reason}\n" + how_to_get(recipe)
            )
        return Path(info["Dir"])

    def replaces_of(self, gomod: Path) -> list[str]:
        """A module's own ``replace`` directives, as ``go mod edit -replace`` arguments."""
        text = self.run(["go", "mod", "edit", "-json", str(gomod)], "read go.mod")
        args = []
        for rep in json.loads(text).get("Replace") or []:
            old, new = rep["Old"], rep["New"]
            lhs = old["Path"] + (f"@{old['Version']}" if old.get("Version") else "")
            rhs = new["Path"] + (f"@{new['Version']}" if new.get("Version") else "")
            args.append(f"-replace={lhs}={rhs}")
        return args

    def source_tree(self, recipe: ServerRecipe, source: ServerSource) -> Path:
        """The folder holding the server module's source (and ``go.mod``) for this build."""
        if source.kind == "proxy":
            return self.download(recipe)
        if source.kind == "folder":
            tree = Path(source.location)
        else:  # archive, pinned_archive
            tree = unpack(Path(source.location), self.work / "unpacked")
        module = _module_path(tree / "go.mod")
        if module != recipe.module:
            raise BuildError(f"{source.describe()} is module {module!r}, not {recipe.module!r}")
        return tree


def _compile(recipe: ServerRecipe, source: ServerSource, module: ThrowawayModule) -> Path:
    """Require, replace, patch and ``go build`` in ``module``; the checked ``bin`` folder."""
    tree = module.source_tree(recipe, source)
    edits = [f"-require={recipe.module}@{recipe.version}"]
    edits += [f"-require={mod}@{ver}" for mod, ver in recipe.extra_requires]
    edits += module.replaces_of(tree / "go.mod")
    if recipe.patches or source.kind != "proxy":
        patched_copy(recipe, tree, module.work / "src")
        edits.append(f"-replace={recipe.module}=./src")
    module.run(["go", "mod", "edit", *edits], "write throwaway go.mod")
    bin_dir = module.work / "bin"
    argv = ["go", "build", "-trimpath", "-o", str(bin_dir) + "/"]
    if recipe.ldflags:
        argv.append(f"-ldflags={recipe.ldflags}")
    argv += [f"{recipe.module}/{pkg}" for pkg in recipe.programs.values()]
    started = time.monotonic()
    module.run(argv, f"go build {recipe.name}")
    for prog in DAEMONS:
        check_version(recipe, bin_dir / prog)
    stamp = {
        "recipe": asdict(recipe),
        "source": asdict(source),
        "go": module.run(["go", "version"], "go version").strip(),
        "build_seconds": round(time.monotonic() - started, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (bin_dir / "build.json").write_text(json.dumps(stamp, indent=2) + "\n")
    return bin_dir


def build_servers(recipe: ServerRecipe, source: ServerSource, final: Path) -> None:
    """Build ``recipe`` from ``source`` into ``final/bin``, all or nothing.

    The work happens in ``.build-<final name>-<pid>`` beside ``final`` and is removed after;
    ``bin`` moves into ``final`` only once every daemon passed its version check.
    """
    if shutil.which("go") is None:
        raise BuildError(
            "Go is not on PATH (the servers are built with the machine's Go toolchain)\n"
            + how_to_get(recipe)
        )
    work = final.parent / f".build-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log.info("%s: building from %s", recipe.name, source.describe())
    try:
        bin_dir = _compile(recipe, source, ThrowawayModule(work, recipe.go_directive))
        final.mkdir(parents=True, exist_ok=True)
        os.replace(bin_dir, final / "bin")
    finally:
        shutil.rmtree(work, ignore_errors=True)
