"""The optional compiled build: which path runs the hot modules, and when a build is not used."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsq_ha import _compiled_finder as finder
from nsq_ha import compiled

# make test's compiled run sets it: there, pure Python would be a silent failure of the build
EXPECT_COMPILED = os.environ.get("NSQ_HA_EXPECT_COMPILED") == "1"
FRAMES = "nsq_ha.protocol.frames"


def write_manifest(directory: Path, hashes: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / finder.MANIFEST).write_text(json.dumps({"modules": hashes}))


def fresh_hashes() -> dict[str, str]:
    return {m: finder.source_hash(m) for m in compiled.MODULES}


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An artifact directory of our own, with NSQ_HA_PURE unset."""
    monkeypatch.delenv(finder.PURE_ENV, raising=False)
    return tmp_path


def decide(directory: Path) -> finder.Decision:
    return finder.decide(compiled.MODULES, str(directory))


def test_a_build_that_matches_its_sources_is_chosen(build_dir: Path) -> None:
    write_manifest(build_dir, fresh_hashes())
    decision = decide(build_dir)
    assert decision.compiled
    assert finder.interpreter_tag() in decision.reason


def test_a_source_changed_since_the_build_selects_pure_python_naming_it(build_dir: Path) -> None:
    write_manifest(build_dir, {**fresh_hashes(), FRAMES: "0" * 64})
    decision = decide(build_dir)
    assert not decision.compiled
    assert decision.stale == (FRAMES,)
    assert "nsq_ha/protocol/frames.py" in decision.reason
    assert "make compiled" in decision.reason


@pytest.mark.parametrize(("value", "compiled_path"), [("1", False), ("yes", False), ("0", True)])
def test_nsq_ha_pure_wins_over_a_build_that_matches(
    build_dir: Path, monkeypatch: pytest.MonkeyPatch, value: str, compiled_path: bool
) -> None:
    write_manifest(build_dir, fresh_hashes())
    monkeypatch.setenv(finder.PURE_ENV, value)
    decision = decide(build_dir)
    assert decision.compiled is compiled_path
    if not compiled_path:
        assert decision.reason == "NSQ_HA_PURE is set"


def test_no_build_for_this_interpreter_is_pure_python_saying_how_to_build(build_dir: Path) -> None:
    decision = decide(build_dir)
    assert not decision.compiled
    assert finder.interpreter_tag() in decision.reason
    assert "make compiled" in decision.reason


def test_a_build_of_another_module_set_is_not_used(build_dir: Path) -> None:
    hashes = fresh_hashes()
    del hashes[FRAMES]
    write_manifest(build_dir, hashes)
    decision = decide(build_dir)
    assert not decision.compiled
    assert "another module set" in decision.reason


def test_an_unreadable_manifest_is_pure_python(build_dir: Path) -> None:
    (build_dir / finder.MANIFEST).write_text("{not json")
    decision = decide(build_dir)
    assert not decision.compiled
    assert "make compiled" in decision.reason


def test_the_finder_loads_the_hot_modules_and_the_group_library_from_the_build(
    build_dir: Path,
) -> None:
    write_manifest(build_dir, fresh_hashes())
    hook = finder.CompiledFinder(directory=str(build_dir))
    assert hook.find_spec("nsq_ha.producer.core") is None
    for name in (FRAMES, finder.LIBRARY):
        spec = hook.find_spec(name)
        assert spec is not None
        assert isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
        assert spec.origin == str(build_dir / finder.built_file(name))


def test_a_stale_build_is_not_loaded_and_said_once(
    build_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_manifest(build_dir, {**fresh_hashes(), FRAMES: "0" * 64})
    hook = finder.CompiledFinder(directory=str(build_dir))
    assert hook.find_spec(FRAMES) is None
    assert hook.find_spec("nsq_ha.transport") is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("nsq_ha: pure Python: the compiled build is older than")


def run_python(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


LOAD_ALL = (
    "import importlib, json, sys\n"
    "import nsq_ha.compiled as c\n"
    "for m in c.MODULES: importlib.import_module(m)\n"
    "print(json.dumps([[m, c.is_compiled(sys.modules[m])] for m in c.MODULES]))\n"
    "print(c.status())\n"
)


def test_nsq_ha_pure_gives_the_pure_python_modules() -> None:
    loaded, status = run_python(LOAD_ALL, NSQ_HA_PURE="1").splitlines()
    assert [m for m, is_compiled in json.loads(loaded) if is_compiled] == []
    assert status.startswith("pure Python: ")


@pytest.mark.skipif(
    not EXPECT_COMPILED, reason="a pure-Python run (make test's 3.12 run expects compiled)"
)
def test_the_compiled_build_is_live_where_the_run_expects_it() -> None:
    assert compiled.status().startswith("compiled: "), compiled.status()
    modules = [importlib.import_module(m) for m in compiled.MODULES]
    assert [m.__name__ for m in modules if not compiled.is_compiled(m)] == []
    assert compiled.active()
    loaded, status = run_python(LOAD_ALL).splitlines()
    assert all(is_compiled for _, is_compiled in json.loads(loaded))
    assert status.startswith("compiled: ")
