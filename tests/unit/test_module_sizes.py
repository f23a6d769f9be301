"""The size check ``make test`` runs on nsq_ha/ (tools/module_sizes.py): the report names the
modules past the 600-line target (split them by noun); only one past the 1000-line limit fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "module_sizes.py"


@pytest.fixture(scope="module")
def sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("module_sizes", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["module_sizes"] = module
    spec.loader.exec_module(module)
    return module


def _package(root: Path, sizes: dict[str, int]) -> Path:
    package = root / "pkg"
    for name, lines in sizes.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)
    return package


def test_a_module_over_the_limit_fails_and_is_named(
    sizes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path, {"__init__.py": 1, "a.py": 600, "sub/b.py": 601, "c.py": 10})
    assert sizes.main([str(package), "--limit", "600"]) == 1
    out = capsys.readouterr().out
    assert "modules over 600 lines: pkg/sub/b.py (601)" in out
    assert "4 modules in pkg/, median 305 lines" in out


def test_modules_at_the_limit_pass(
    sizes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path, {"__init__.py": 0, "a.py": 600})
    assert sizes.main([str(package)]) == 0
    assert "modules over 600 lines: none" in capsys.readouterr().out


def test_an_empty_package_is_an_error_not_a_pass(sizes: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(SystemExit, match="no Python module"):
        sizes.main([str(tmp_path / "pkg")])


def test_a_module_past_the_target_is_reported_and_passes(
    sizes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path, {"__init__.py": 1, "big.py": 1000, "mid.py": 601})
    assert sizes.main([str(package)]) == 0
    out = capsys.readouterr().out
    assert "modules over 600 lines: pkg/big.py (1000), pkg/mid.py (601)" in out
    assert "modules over the 1000-line limit: none" in out


def test_a_module_past_the_limit_fails(
    sizes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path, {"__init__.py": 1, "huge.py": 1001})
    assert sizes.main([str(package)]) == 1
    assert "modules over the 1000-line limit: pkg/huge.py (1001)" in capsys.readouterr().out


def test_the_target_and_the_limit_are_options(
    sizes: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path, {"__init__.py": 1, "a.py": 301})
    assert sizes.main([str(package), "--target", "200", "--limit", "300"]) == 1
    out = capsys.readouterr().out
    assert "modules over 200 lines: pkg/a.py (301)" in out
    assert "modules over the 300-line limit: pkg/a.py (301)" in out
