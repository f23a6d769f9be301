"""The docs site's shape: a short README that links to the guide, a page per public class, and a
command-line page generated from the program's own parser.

``make docs`` builds the site with ``-W``; tests/integration/test_readme.py runs the pages' code
blocks. This module checks what neither of them would notice.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: each public class's page, and the class as its first autodoc directive names it (the errors
#: module has a page too)
CLASS_PAGES = {
    "producer.rst": "Producer",
    "consumer.rst": "Consumer",
    "message.rst": "Message",
    "sync-producer.rst": "nsq_ha.sync.Producer",
    "sync-consumer.rst": "Consumer",
    "lookup.rst": "LookupClient",
    "lookupd-admin.rst": "LookupdAdmin",
    "nsqd-admin.rst": "NsqdAdmin",
    "devcluster.rst": "DevCluster",
}


def test_the_readme_is_an_overview_of_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to a page of docs/"


def test_every_link_of_the_readme_into_docs_names_a_page() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert len(links) >= 10, links
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, missing


@pytest.mark.parametrize(("page", "cls"), sorted(CLASS_PAGES.items()))
def test_each_public_class_has_its_page_and_comes_first(page: str, cls: str) -> None:
    """The page's first autodoc directive is the class: no module's members open it."""
    path = DOCS / "api" / page
    assert path.is_file(), f"no page {page} for {cls}"
    text = path.read_text(encoding="utf-8")
    directives = re.findall(r"^\.\. auto(class|module):: (\S+)(\n   :no-members:)?", text, re.M)
    documented = [(kind, name) for kind, name, bare in directives if not bare]
    assert documented, f"{page} documents nothing"
    assert documented[0] == ("class", cls), f"{page} opens with {documented[0]}, not {cls}"


def test_the_api_index_lists_every_class_page_and_the_errors() -> None:
    index = (DOCS / "api" / "index.rst").read_text(encoding="utf-8")
    for page in [*CLASS_PAGES, "errors.rst"]:
        assert f"\n   {page.removesuffix('.rst')}\n" in index, f"{page} is not in the toctree"


def test_the_command_line_page_is_generated_from_the_programs_parser() -> None:
    from nsq_ha import cli

    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    directive = re.search(r"```\{argparse\}\n:module: (\S+)\n:func: (\S+)\n:prog: (\S+)\n", page)
    assert directive is not None, "docs/cli.md has no argparse directive"
    module, func, prog = directive.groups()
    assert (module, prog) == ("nsq_ha.cli", "nsq-ha")
    parser = getattr(cli, func)()
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.prog == prog


def test_the_site_uses_a_maintained_theme_with_a_page_table_of_contents() -> None:
    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    assert re.search(r'^html_theme = "furo"', conf, re.M)
    assert re.search(r'^autodoc_typehints = "description"', conf, re.M)
