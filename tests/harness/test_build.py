"""The server builder: recipe identity, source patches, and failures that explain themselves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nsq_ha.testing import build
from nsq_ha.testing.build import FORK, VANILLA, BuildError, SourcePatch


def test_recipe_key_changes_with_the_pin() -> None:
    moved = dataclasses.replace(FORK, version="v0.3.7-HA.1.12.7")
    assert moved.key() != FORK.key()
    assert moved.dirname != FORK.dirname
    assert FORK.key() == dataclasses.replace(FORK).key()  # stable for an unchanged recipe
    patched = dataclasses.replace(FORK, patches=())
    assert patched.key() != FORK.key()


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
    build._patched_copy(FORK, src, dest)
    assert "reservedFDNum = 5000\n" in (dest / "nsqdserver" / "nsqd_server.go").read_text()
    assert "50000" in (src / "nsqdserver" / "nsqd_server.go").read_text()  # original untouched


@pytest.mark.parametrize("text", ["reservedFDNum = 40000\n", "reservedFDNum = 50000\n" * 2])
def test_patch_refuses_a_changed_source(tmp_path: Path, text: str) -> None:
    src = _module_tree(tmp_path, text)
    with pytest.raises(BuildError, match="exactly once"):
        build._patched_copy(FORK, src, tmp_path / "copy")


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
