"""What importing the client loads: the client core and nothing of the other products.

The wheel also carries the embedded broker (``nsq_ha.devcluster``, the ``devcluster`` extra with
``h11``), the server builder and pytest plugin (``nsq_ha.testing``), the benchmark, the command
line and the Spark source; a program that only produces and consumes loads none of them.  The
import runs in a fresh interpreter (``tools/core_lines.py``, which also counts the core's lines).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "core_lines.py"


@pytest.fixture(scope="module")
def core_lines() -> ModuleType:
    spec = importlib.util.spec_from_file_location("core_lines", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["core_lines"] = module
    spec.loader.exec_module(module)
    return module


def test_the_client_core_loads_no_other_product(core_lines: ModuleType) -> None:
    modules = core_lines.loaded_modules()
    counts = core_lines.core_lines(modules)
    print(f"client core: {len(counts)} files, {sum(counts.values())} lines")
    assert "nsq_ha.producer.core" in modules  # the import did load the client
    assert core_lines.forbidden(modules) == []


def test_the_check_names_what_another_product_loads(core_lines: ModuleType) -> None:
    modules = core_lines.loaded_modules("import nsq_ha.devcluster")
    found = core_lines.forbidden(modules)
    assert "h11" in found
    assert "nsq_ha.devcluster" in found


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("import nsq_ha.testing.plugin", id="pytest-plugin"),
        pytest.param("import nsq_ha.cli; nsq_ha.cli.build_parser()", id="cli-parser"),
    ],
)
def test_starting_pytest_or_the_cli_loads_no_embedded_broker(
    core_lines: ModuleType, statement: str
) -> None:
    """pytest imports the plugin in every session of every user who has nsq-ha installed, and
    every ``nsq-ha`` command builds the parser: the embedded broker (and ``h11``) is imported
    only by what uses it (the ``devcluster`` fixture, ``nsq-ha devcluster`` and ``demo``)."""
    modules = core_lines.loaded_modules(statement)
    loaded = [name for name in modules if name == "h11" or name.startswith("nsq_ha.devcluster")]
    assert loaded == []


def test_the_summary_lists_the_largest_files_and_the_whole_total(core_lines: ModuleType) -> None:
    lines = core_lines.report({"a.py": 10, "b.py": 30, "c.py": 20}, [], files=2)
    assert [line.split()[0] for line in lines[:2]] == ["b.py", "c.py"]
    assert lines[2].startswith("client core: 3 files, 60 lines")
    assert lines[3] == "modules of the other products loaded: none"
