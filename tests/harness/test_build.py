"""The server builder: recipe identity, source patches, and failures that explain themselves."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nsq_ha.testing import build, sources
from nsq_ha.testing.build import (
    FORK,
    VANILLA,
    BuildError,
    PinnedArchive,
    ServerRecipe,
    ServerSource,
    SourcePatch,
    how_to_get,
    resolve_source,
)
from nsq_ha.testing.gobuild import patched_copy, unpack


def test_recipe_key_changes_with_the_pin() -> None:
    moved = dataclasses.replace(FORK, version="v0.3.7-HA.1.12.7")
    assert moved.key() != FORK.key()
    assert moved.dirname() != FORK.dirname()
    assert FORK.key() == dataclasses.replace(FORK).key()  # stable for an unchanged recipe
    patched = dataclasses.replace(FORK, patches=())
    assert patched.key() != FORK.key()


def test_recipe_key_changes_with_the_source() -> None:
    assert FORK.key("a" * 64) != FORK.key()
    assert FORK.key("a" * 64) != FORK.key("b" * 64)
    assert FORK.dirname("a" * 64).startswith(f"fork-{FORK.version}-")
    # where the pinned archive is kept is not what is built
    assert dataclasses.replace(FORK, archive=None).key() == FORK.key()


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NSQ_HA_CACHE_DIR", str(tmp_path))
    assert build.cache_root() == tmp_path
    assert build.find_built(VANILLA) is None


def test_fork_patch_lowers_the_fd_reserve() -> None:
    (patch,) = FORK.patches
    assert patch.path == "nsqdserver/nsqd_server.go"
    assert patch.old == "reservedFDNum = 50000"
    assert patch.new == "reservedFDNum = 5000"


def _module_tree(root: Path, text: str) -> Path:
    src = root / "mod"
    (src / "nsqdserver").mkdir(parents=True)
    (src / "nsqdserver" / "nsqd_server.go").write_text(text)
    for p in (src / "nsqdserver" / "nsqd_server.go", src / "nsqdserver", src):
        p.chmod(0o555 if p.is_dir() else 0o444)  # like the read-only module cache
    return src


def test_patch_applies_to_a_writable_copy(tmp_path: Path) -> None:
    src = _module_tree(tmp_path, "const (\n\treservedFDNum = 50000\n)\n")
    dest = tmp_path / "copy"
    patched_copy(FORK, src, dest)
    assert "reservedFDNum = 5000\n" in (dest / "nsqdserver" / "nsqd_server.go").read_text()
    assert "50000" in (src / "nsqdserver" / "nsqd_server.go").read_text()  # original untouched


@pytest.mark.parametrize("text", ["reservedFDNum = 40000\n", "reservedFDNum = 50000\n" * 2])
def test_patch_refuses_a_changed_source(tmp_path: Path, text: str) -> None:
    src = _module_tree(tmp_path, text)
    with pytest.raises(BuildError, match="exactly once"):
        patched_copy(FORK, src, tmp_path / "copy")


def test_without_go_the_build_fails_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NSQ_HA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("NSQ_HA_VANILLA_BIN_DIR", raising=False)
    with pytest.raises(BuildError, match="Go is not on PATH"):
        build.ensure_built(VANILLA)
    reason = build.last_failure(VANILLA)
    assert reason is not None
    assert "Go is not on PATH" in reason
    assert build.main(["vanilla", "--keep-going"]) == 0
    assert build.main(["vanilla"]) == 1


def test_override_dir_must_hold_every_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NSQ_HA_VANILLA_BIN_DIR", str(tmp_path))
    (tmp_path / "nsqd").write_text("")
    with pytest.raises(BuildError, match="lacks one of"):
        build.ensure_built(VANILLA)


def test_override_binaries_are_version_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for prog in FORK.programs:
        exe = tmp_path / prog
        exe.write_text("#!/bin/sh\necho 'nsqd v1.2.1 (built w/go1.16)'\n")
        exe.chmod(0o755)
    monkeypatch.setenv("NSQ_HA_FORK_BIN_DIR", str(tmp_path))
    with pytest.raises(BuildError, match=r"expected it to contain '0\.3\.7-HA\.1\.13\.0'"):
        build.ensure_built(FORK)


def test_unknown_recipe_name_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build.main(["kafka"])
    assert exc.value.code == 2


def test_source_patch_is_part_of_the_recipe_identity() -> None:
    other = dataclasses.replace(
        FORK, patches=(SourcePatch("nsqdserver/nsqd_server.go", "a", "b", "why"),)
    )
    assert other.key() != FORK.key()


# -- where the servers come from ----------------------------------------------------------------

TINY_MAIN = """package main

import (
\t"flag"
\t"fmt"
)

func main() {
\tversion := flag.Bool("version", false, "print the version")
\tflag.Parse()
\tif *version {
\t\tfmt.Println("%s v9.9.9-tiny")
\t}
}
"""


def _tiny_module(root: Path, module: str = "example.com/tinynsq") -> Path:
    """A Go module with ``apps/nsqd`` and ``apps/nsqlookupd`` that print a version."""
    root.mkdir(parents=True)
    (root / "go.mod").write_text(f"module {module}\n\ngo 1.22\n")
    for prog in ("nsqd", "nsqlookupd"):
        (root / "apps" / prog).mkdir(parents=True)
        (root / "apps" / prog / "main.go").write_text(TINY_MAIN % prog)
    return root


TINY = ServerRecipe(
    name="tiny",
    module="example.com/tinynsq",
    version="v0.0.0-20240101000000-000000000000",
    programs={"nsqd": "apps/nsqd", "nsqlookupd": "apps/nsqlookupd"},
    expected_version="v9.9.9-tiny",
)


def _tar(src: Path, dest: Path, top: str) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname=top)
    return dest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No source variables, an empty cache, and a project root with no ../shared."""
    for recipe in (FORK, VANILLA, TINY):
        monkeypatch.delenv(f"{recipe.env_prefix}_BIN_DIR", raising=False)
        monkeypatch.delenv(f"{recipe.env_prefix}_SOURCE", raising=False)
    monkeypatch.setenv("NSQ_HA_CACHE_DIR", str(tmp_path / "cache"))
    project = tmp_path / "work" / "project"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    monkeypatch.setattr(sources, "project_root", lambda: project)
    monkeypatch.chdir(project)
    return project


def _pin(project: Path, data: bytes) -> PinnedArchive:
    servers = project.parent / "shared" / "servers"
    servers.mkdir(parents=True)
    (servers / "src.tar.gz").write_bytes(data)
    return PinnedArchive("src.tar.gz", hashlib.sha256(data).hexdigest())


def test_sources_in_order_bin_dir_source_pinned_archive_proxy(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pinned = _pin(clean_env, b"pinned bytes")
    recipe = dataclasses.replace(FORK, archive=pinned)
    source = resolve_source(recipe)
    assert source.kind == "pinned_archive"
    assert source.location == str(clean_env.parent / "shared" / "servers" / "src.tar.gz")
    assert source.digest == pinned.sha256

    folder = _tiny_module(tmp_path / "checkout")
    monkeypatch.setenv("NSQ_HA_FORK_SOURCE", str(folder))
    assert resolve_source(recipe).kind == "folder"

    monkeypatch.setenv("NSQ_HA_FORK_BIN_DIR", str(tmp_path))
    assert resolve_source(recipe) == ServerSource("bin_dir", str(tmp_path))

    monkeypatch.delenv("NSQ_HA_FORK_BIN_DIR")
    monkeypatch.delenv("NSQ_HA_FORK_SOURCE")
    assert resolve_source(recipe).kind == "pinned_archive"
    assert resolve_source(dataclasses.replace(FORK, archive=None)) == ServerSource(
        "proxy", f"{FORK.module}@{FORK.version}"
    )


def test_a_pinned_archive_that_does_not_match_its_sha256_is_refused(clean_env: Path) -> None:
    pinned = _pin(clean_env, b"tampered")
    recipe = dataclasses.replace(FORK, archive=PinnedArchive("src.tar.gz", "0" * 64))
    with pytest.raises(BuildError, match=r"has sha256 .*, but the fork recipe pins 0000"):
        resolve_source(recipe)
    assert build.find_built(recipe) is None
    reason = build.last_failure(recipe)
    assert reason is not None
    assert pinned.sha256 in reason


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p, "does not exist"),
        (lambda p: (p.mkdir(), p)[1], "folder without a go.mod"),
        (lambda p: (p.write_text("x"), p)[1], r"neither a folder nor a \.tar\.gz"),
    ],
)
def test_a_named_source_that_is_not_a_source_is_an_error(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, make: Any, match: str
) -> None:
    monkeypatch.setenv("NSQ_HA_FORK_SOURCE", str(make(tmp_path / "src")))
    with pytest.raises(BuildError, match=match):
        resolve_source(FORK)


def test_how_to_get_names_every_way(clean_env: Path) -> None:
    text = how_to_get(FORK)
    assert FORK.archive is not None
    for way in (
        "NSQ_HA_FORK_BIN_DIR",
        "NSQ_HA_FORK_SOURCE",
        FORK.archive.filename,
        "the Go module proxy",
        "make servers",
    ):
        assert way in text
    assert str(clean_env.parent / "shared" / "servers") in text
    assert "pinned archive" not in how_to_get(VANILLA)


def test_an_archive_that_escapes_its_folder_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(BuildError, match="cannot unpack"):
        unpack(evil, tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists()


def test_an_archive_without_a_go_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a" / "x").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    with tarfile.open(tmp_path / "two.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "a", arcname="a")
        tar.add(tmp_path / "b", arcname="b")
    with pytest.raises(BuildError, match=r"no go\.mod"):
        unpack(tmp_path / "two.tar.gz", tmp_path / "out")


needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go on PATH")


@needs_go
def test_build_from_a_source_folder_then_from_an_archive(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real build through the recipe's path: throwaway module, directory replace, --version
    check, build.json; another source is another cache entry, the same one is reused."""
    folder = _tiny_module(tmp_path / "checkout")
    monkeypatch.setenv("NSQ_HA_TINY_SOURCE", str(folder))
    assert build.find_built(TINY) is None
    built = build.ensure_built(TINY)
    assert build.find_built(TINY) == built
    stamp = json.loads((built.bin_dir / "build.json").read_text())
    assert stamp["source"]["kind"] == "folder"
    assert stamp["source"]["location"] == str(folder)
    out = subprocess.run([str(built.nsqd), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "nsqd v9.9.9-tiny"

    archive = _tar(folder, tmp_path / "tiny.tar.gz", "tinynsq-abc123")
    monkeypatch.setenv("NSQ_HA_TINY_SOURCE", str(archive))
    from_archive = build.ensure_built(TINY)
    assert from_archive.bin_dir != built.bin_dir
    assert json.loads((from_archive.bin_dir / "build.json").read_text())["source"]["digest"] == (
        hashlib.sha256(archive.read_bytes()).hexdigest()
    )
    monkeypatch.setenv("NSQ_HA_TINY_SOURCE", str(folder))
    assert build.ensure_built(TINY) == built  # the first source's build is still cached


@needs_go
def test_a_source_of_another_module_fails_and_says_so(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = _tiny_module(tmp_path / "other", module="example.com/other")
    monkeypatch.setenv("NSQ_HA_TINY_SOURCE", str(folder))
    with pytest.raises(BuildError, match=r"is module 'example\.com/other', not 'example\.com/"):
        build.ensure_built(TINY)
    assert "is module" in (build.last_failure(TINY) or "")
