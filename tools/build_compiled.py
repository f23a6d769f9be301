"""Build the optional mypyc-compiled hot modules for the interpreter that runs this script.

``python tools/build_compiled.py`` compiles ``nsq_ha.compiled.MODULES`` with mypyc (one group,
``-O3``) and puts the extension modules with a manifest of the sources' hashes into
``nsq_ha/_compiled/<interpreter tag>/`` (git-ignored), then writes ``nsq_ha_compiled.pth`` into
this interpreter's site-packages, so that ``nsq_ha._compiled_finder`` loads them while they
match their sources (``NSQ_HA_PURE=1`` still selects pure Python). ``make compiled`` runs it.

- ``--pure`` removes the build and the ``.pth`` file: back to pure Python.
- ``--or-pure`` (``make demo``): when there is no working C compiler or the build fails, say so
  in one line, leave pure Python in place and exit 0.
- ``--probe``: only check for a working C compiler; without one, say so in one line, exit 1.
- ``--wheel DIR``: instead of building, turn the pure wheel in DIR (``pip wheel --no-deps .``)
  into a compiled wheel for this interpreter (the build, the ``.pth`` file, the tags), beside it.

Needs mypy (it brings mypyc) and setuptools: ``pip install --group compiled``. Never needed by
``pip install .``, whose wheel is pure Python.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nsq_ha import _compiled_finder as compiled  # noqa: E402  (the package's module list, layout)

# One line (site.py executes a .pth line that starts with "import"): load the finder by its
# path without importing nsq_ha itself (see nsq_ha/_compiled_finder.py), then install it.
PTH_LINE = (
    "import importlib.util as u, os, sys; p = u.find_spec('nsq_ha'); "
    "f = p and p.submodule_search_locations"
    " and os.path.join(p.submodule_search_locations[0], '_compiled_finder.py'); "
    "s = f and os.path.exists(f) and u.spec_from_file_location('nsq_ha._compiled_finder', f); "
    "m = s and sys.modules.setdefault(s.name, u.module_from_spec(s)); "
    "s and s.loader.exec_module(m); "
    "m and m.install()\n"
)


class BuildError(Exception):
    """The compiled build cannot be made here; the message says why."""


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def check_compiler(work: Path) -> None:
    """Compile a small C file against Python.h with the compiler setuptools will use ($CC or
    the interpreter's), so that a missing compiler or missing headers are named before mypyc
    runs."""
    command = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not command or shutil.which(command[0]) is None:
        raise BuildError(f"no C compiler ({' '.join(command) or 'cc'} not found)")
    source = work / "probe.c"
    source.write_text("#include <Python.h>\nint nsq_ha_probe(void) { return 0; }\n")
    include = sysconfig.get_paths()["include"]
    argv = [*command, "-I", include, "-c", str(source), "-o", str(work / "probe.o")]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"no working C compiler ({' '.join(command)}: {exc})") from exc
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise BuildError(f"no working C compiler ({' '.join(command)}: {said})")


def compile_modules(work: Path) -> dict[str, Path]:
    """Run mypyc and the C compiler; the extension module of each name."""
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise BuildError(f"{exc}: install the build's tools: pip install --group compiled") from exc
    paths = [str(Path(compiled.source_path(m)).relative_to(ROOT)) for m in compiled.MODULES]
    options = [
        f"--config-file={ROOT / 'pyproject.toml'}",
        f"--cache-dir={ROOT / 'build' / 'mypyc' / compiled.interpreter_tag() / 'cache'}",
    ]
    c_dir = ROOT / "build" / "mypyc" / compiled.interpreter_tag() / "c"
    extensions = mypycify(
        [*options, *paths], group_name=compiled.GROUP, opt_level="3", target_dir=str(c_dir)
    )
    dist = Distribution({"name": "nsq_ha_compiled", "ext_modules": extensions})
    command = dist.get_command_obj("build_ext")
    command.build_lib = str(work / "lib")
    command.build_temp = str(work / "temp")
    command.ensure_finalized()
    command.run()
    built = {}
    for file in (work / "lib").rglob(f"*{compiled.EXT_SUFFIX}"):
        relative = file.relative_to(work / "lib")
        name = ".".join(relative.with_name(relative.name.removesuffix(compiled.EXT_SUFFIX)).parts)
        built[name] = file
    missing = {*compiled.MODULES, compiled.LIBRARY} - set(built)
    if missing:
        raise BuildError(f"mypyc built no extension for {', '.join(sorted(missing))}")
    return built


def build() -> Path:
    """The whole build, into place; the artifact directory."""
    import json

    before = {m: compiled.source_hash(m) for m in compiled.MODULES}
    with tempfile.TemporaryDirectory(prefix="nsq_ha-mypyc-") as tmp:
        work = Path(tmp)
        check_compiler(work)
        cwd = Path.cwd()
        try:
            os.chdir(ROOT)  # mypy names the modules from the paths, relative to the root
            built = compile_modules(work)
        finally:
            os.chdir(cwd)
        after = {m: compiled.source_hash(m) for m in compiled.MODULES}
        changed = sorted(m for m in compiled.MODULES if before[m] != after[m])
        if changed:
            raise BuildError(f"sources changed during the build ({', '.join(changed)}): run again")
        target = Path(compiled.artifact_dir())
        staging = target.with_name(target.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name, file in built.items():
            (staging / compiled.built_file(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, staging / compiled.built_file(name))
        manifest = {"modules": before, "group": compiled.GROUP, "python": sys.version}
        (staging / compiled.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    (site_packages() / compiled.PTH_NAME).write_text(PTH_LINE)
    return target


def remove() -> None:
    shutil.rmtree(compiled.artifact_dir(), ignore_errors=True)
    (site_packages() / compiled.PTH_NAME).unlink(missing_ok=True)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def compiled_wheel(wheel_dir: Path) -> Path:
    """The pure wheel in ``wheel_dir`` plus this interpreter's build and the ``.pth`` file."""
    pure = sorted(wheel_dir.glob("nsq_ha-*-py3-none-any.whl"))
    if not pure:
        raise BuildError(f"no pure wheel in {wheel_dir}: run pip wheel --no-deps -w {wheel_dir} .")
    source = pure[-1]
    tag = sys.implementation.cache_tag.replace("cpython-", "cp")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    target = wheel_dir / source.name.replace("py3-none-any", f"{tag}-{tag}-{platform}")
    artifacts = Path(compiled.artifact_dir())
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(source) as pure_zip:
        for info in pure_zip.infolist():
            files[info.filename] = pure_zip.read(info)
    dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/WHEEL"))
    wheel_meta = files[f"{dist_info}/WHEEL"].decode()
    wheel_meta = wheel_meta.replace("Root-Is-Purelib: true", "Root-Is-Purelib: false")
    wheel_meta = wheel_meta.replace("Tag: py3-none-any", f"Tag: {tag}-{tag}-{platform}")
    files[f"{dist_info}/WHEEL"] = wheel_meta.encode()
    relative = artifacts.relative_to(Path(compiled.PACKAGE_DIR).parent).as_posix()
    for file in sorted(p for p in artifacts.rglob("*") if p.is_file()):
        files[f"{relative}/{file.relative_to(artifacts).as_posix()}"] = file.read_bytes()
    files[compiled.PTH_NAME] = PTH_LINE.encode()
    record_name = f"{dist_info}/RECORD"
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    for name, data in files.items():
        if name != record_name:
            writer.writerow([name, _record_hash(data), len(data)])
    writer.writerow([record_name, "", ""])
    files[record_name] = rows.getvalue().encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in files.items():
            out.writestr(name, data)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pure", action="store_true", help="remove the build")
    group.add_argument("--or-pure", action="store_true", help="fall back to pure Python")
    group.add_argument("--probe", action="store_true", help="only check for a C compiler")
    group.add_argument("--wheel", type=Path, metavar="DIR", help="package the build as a wheel")
    args = parser.parse_args(argv)
    if args.pure:
        remove()
        print("nsq_ha: pure Python (compiled build removed)")
        return 0
    if args.probe:
        with tempfile.TemporaryDirectory(prefix="nsq_ha-probe-") as tmp:
            try:
                check_compiler(Path(tmp))
            except BuildError as exc:
                print(f"nsq_ha: pure Python (the compiled build is optional: {exc})")
                return 1
        return 0
    if args.wheel is not None:
        decision = compiled.decide()
        if not decision.compiled:
            print(f"nsq_ha: no compiled wheel: {decision.reason}", file=sys.stderr)
            return 1
        print(f"nsq_ha: compiled wheel {compiled_wheel(args.wheel)}")
        return 0
    try:
        target = build()
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error; the compiler raises
        if not args.or_pure:
            print(f"nsq_ha: compiled build failed: {exc}", file=sys.stderr)
            return 1
        remove()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"nsq_ha: pure Python (the compiled build is optional: {reason})")
        return 0
    print(f"nsq_ha: compiled {len(compiled.MODULES)} modules into {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
