"""What `make install` installs and what `make docs` documents, against pyproject.toml.

The extras are what users install; the dependency groups (PEP 735) are this project's own tools.
The Makefile installs both; the docs include the Markdown guides and document the public API.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAKEFILE = (ROOT / "Makefile").read_text()
DOCS = ROOT / "docs"

# what a user of the package never needs: the project's test, lint and docs tools
DEV_TOOLS = {
    "pytest-asyncio",
    "hypothesis",
    "trustme",
    "pyyaml",
    "ruff",
    "mypy",
    "import-linter",
    "sphinx",
    "myst-parser",
}
PUBLIC_MODULES = (
    "nsq_ha",
    "nsq_ha.producer",
    "nsq_ha.consumer",
    "nsq_ha.lookup",
    "nsq_ha.connection",
    "nsq_ha.errors",
    "nsq_ha.sync",
    "nsq_ha.admin",
    "nsq_ha.events",
    "nsq_ha.otel",
    "nsq_ha.spark",
    "nsq_ha.devcluster",
    "nsq_ha.testing",
    "nsq_ha.testing.plugin",
    "nsq_ha.routing",
    "nsq_ha.protocol",
)


def _name(requirement: str) -> str:
    m = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert m, requirement
    return m.group(0).lower().replace("_", "-")


def _make_variable(name: str) -> str:
    m = re.search(rf"^{name}\s*:=\s*(.*)$", MAKEFILE, re.M)
    assert m, f"the Makefile sets no {name}"
    return m.group(1).strip()


def test_the_test_extra_is_what_the_pytest_plugin_needs() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert [_name(r) for r in extras["test"]] == ["pytest"]
    assert PYPROJECT["project"]["entry-points"]["pytest11"] == {
        "nsq_ha_servers": "nsq_ha.testing.plugin"
    }
    for extra, requirements in extras.items():
        leaked = {_name(r) for r in requirements} & DEV_TOOLS
        assert not leaked, f"extra {extra!r} installs development tools {leaked}"


def test_the_tools_are_dependency_groups() -> None:
    groups = PYPROJECT["dependency-groups"]
    names = {g: {_name(r) for r in reqs if isinstance(r, str)} for g, reqs in groups.items()}
    assert {"ruff", "mypy", "import-linter"} <= names["lint"]
    assert {"sphinx", "myst-parser"} <= names["docs"]
    assert {"pytest", "pytest-asyncio", "hypothesis"} <= names["test"]


def test_make_install_installs_every_group_and_the_extras_the_tests_use() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    wanted = set(_make_variable("EXTRAS").split(","))
    assert wanted <= extras, f"the Makefile installs extras that do not exist: {wanted - extras}"
    # every extra but the plugin's own (the test group has pytest) and uvloop (in the test group)
    assert extras - wanted <= {"test", "uvloop"}, f"not installed by make: {extras - wanted}"
    groups = set(re.findall(r"--group (\S+)", _make_variable("GROUPS")))
    assert groups == set(PYPROJECT["dependency-groups"])
    assert "-m pip install --quiet --upgrade pip" in MAKEFILE, "--group needs pip >= 25.1"


def test_make_test_builds_the_docs_with_warnings_as_errors() -> None:
    m = re.search(r"^test:(.*)$", MAKEFILE, re.M)
    assert m, "no test target"
    assert "docs" in m.group(1).split(), "make test does not build the docs"
    m = re.search(r"^docs:.*\n\t(.*)$", MAKEFILE, re.M)
    assert m, "no docs recipe"
    recipe = m.group(1).split()
    for word in ("sphinx", "-W", "--keep-going"):
        assert word in recipe, f"the docs recipe lacks {word}: {recipe}"
    assert "docs/_build/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("guide", ["README.md", "ARCHITECTURE.md", "CHANGELOG.md"])
def test_the_guides_are_included_not_copied(guide: str) -> None:
    includes = {
        (page.parent / m.group(1)).resolve()
        for page in DOCS.rglob("*.md")
        for m in re.finditer(r"^```\{include\}\s+(\S+)", page.read_text(), re.M)
    }
    assert (ROOT / guide).resolve() in includes


def test_the_docs_build_offline() -> None:
    """No intersphinx: it fetches other projects' inventories from the internet."""
    tree = ast.parse((DOCS / "conf.py").read_text())
    settings = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    extensions = ast.literal_eval(settings["extensions"])
    assert "sphinx.ext.autodoc" in extensions
    assert "sphinx.ext.intersphinx" not in extensions
    assert "intersphinx_mapping" not in settings


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_module_has_an_api_page(module: str) -> None:
    pages = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.rst"))
    assert re.search(rf"^\.\. automodule:: {re.escape(module)}$", pages, re.M), module
