"""The size check ``make test`` runs on nsq_ha/ (tools/module_sizes.py)."""

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
