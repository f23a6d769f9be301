"""Sphinx configuration: the API reference from the docstrings, plus the Markdown guides.

``make docs`` builds it with ``-W --keep-going`` (a warning fails the build) into ``docs/_build``.
The build is offline: no intersphinx (it would fetch inventories from the internet), and only
the extensions and theme of the ``docs`` dependency group in pyproject.toml: myst-parser (the
Markdown pages), sphinx-argparse (the command line's page, generated from its parser) and Furo.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from sphinx.domains.python import PythonDomain

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the working tree, installed or not

from nsq_ha import __version__  # noqa: E402

project = "nsq_ha"
author = "nsq_ha contributors"
copyright = "nsq_ha contributors"  # noqa: A001  (Sphinx's setting name)
release = __version__
version = __version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinxarg.ext",  # the ``argparse`` directive of docs/cli.md
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "screenshots"]
# The guides (README.md, ARCHITECTURE.md, CHANGELOG.md, bench/ and docker/README.md) stay where
# they are: a page here named like each one *includes* it (index.md is the README, the overview),
# so that their relative links to each other resolve in the docs as they do on a repository
# browser.  The user's guide is the Markdown pages of this folder (quickstart.md, producing.md,
# ...); their code blocks are run by tests/integration/test_readme.py, as the README's are.
root_doc = "index"
templates_path: list[str] = []

# -- Markdown (myst-parser) --------------------------------------------------------------------
# GitHub-style heading anchors, so the README's own links (#run-the-tests) resolve here too.
myst_heading_anchors = 3
# A Markdown link names a page or a heading, or a Python object: not a command of the CLI page
# (sphinx-argparse's domain cannot resolve such links and would warn on every one).
myst_ref_domains = ["std", "py"]

# -- autodoc -----------------------------------------------------------------------------------
autodoc_default_options = {
    "members": True,  # a module's members are its __all__ when it has one
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
# Parameters are listed under the signature, each with its type and (from the docstring's
# "Args:" section, through napoleon) its description; the signature keeps names and defaults,
# one per line when it is long.
autodoc_typehints = "description"
autodoc_typehints_description_target = "all"
autodoc_class_signature = "mixed"
python_maximum_signature_line_length = 88
# napoleon reads a docstring's "Args:" section (see _google_args below).
autodoc_preserve_defaults = True
autoclass_content = "both"  # the class docstring, then __init__'s (LookupClient's options)
# Nothing is mocked: the pages import the package with the extras `make install` installs
# (spark, otel; pytest for nsq_ha.testing), so they document the real classes, and an import
# error in a module fails the build.

# nitpicky stays off (the default): annotations name many types outside this package
# (asyncio, httpx, pyspark, typing aliases) that have no target without intersphinx, which
# would need the internet.  A reference to a target that does not exist renders as plain text;
# real breakage (bad reST in a docstring, an import error, a duplicate object) still warns.
nitpicky = False

# -- HTML --------------------------------------------------------------------------------------
# Furo: the navigation on the left (every page, nested, wrapped rather than cut), the page's
# own table of contents on the right, code blocks that scroll inside the page.
html_theme = "furo"
html_title = f"nsq_ha {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {
    "navigation_with_keys": True,
    "top_of_page_buttons": [],
}


# -- one object, one page: references by any import path ---------------------------------------
# A class is documented once, where its package re-exports it (``nsq_ha.producer.Producer``),
# but docstrings also name it by its defining module (``nsq_ha.producer.policy.RetryPolicy``)
# or by the top-level alias (``nsq_ha.Producer``).  This resolves such a reference to the one
# documented object by identity.
_documented: dict[int, str] = {}


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _missing_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    candidates = [target]
    module = node.get("py:module")
    if module and "." not in target:
        candidates.append(f"{module}.{target}")
    domain = env.get_domain("py")
    if not _documented:
        for fullname in domain.objects:
            obj = _resolve(fullname)
            if obj is not None and not isinstance(obj, (int, float, str, bytes, bool)):
                _documented.setdefault(id(obj), fullname)
    for candidate in candidates:
        if not candidate.startswith("nsq_ha"):
            continue
        obj = _resolve(candidate)
        fullname = _documented.get(id(obj)) if obj is not None else None
        if fullname is not None and fullname != candidate:
            node["reftarget"] = fullname
            return domain.resolve_xref(
                env, node["refdoc"], app.builder, node["reftype"], fullname, node, contnode
            )
    return None


# ``nsq_ha.sync`` has blocking twins of the asyncio classes under the same names (Producer,
# Consumer, Message).  An annotation that autodoc could not qualify (a name imported only under
# TYPE_CHECKING) matches both; outside nsq_ha.sync it means the asyncio class, inside it the twin.
# Any other ambiguity still warns (and fails the build).
class _PythonDomain(PythonDomain):
    def find_obj(
        self,
        env: Any,
        modname: str,
        classname: str,
        name: str,
        type: str | None,  # noqa: A002  (Sphinx's parameter name)
        searchmode: int = 0,
    ) -> list[tuple[str, Any]]:
        matches = super().find_obj(env, modname, classname, name, type, searchmode)
        if len(matches) > 1:
            in_sync = (modname or "").startswith("nsq_ha.sync")
            twins = [m for m in matches if m[0].startswith("nsq_ha.sync.") == in_sync]
            if twins:
                matches = twins
        return matches


def _drop_object_base(app: Any, name: str, obj: object, options: Any, bases: list[type]) -> None:
    """``show-inheritance`` without the noise of "Bases: object" on every plain class."""
    if bases == [object]:
        bases.clear()


def _drop_empty_bases(app: Any, doctree: Any) -> None:
    """Autodoc still writes the "Bases:" label when :func:`_drop_object_base` left no base."""
    from docutils import nodes

    for paragraph in list(doctree.findall(nodes.paragraph)):
        if paragraph.astext().strip() == "Bases:":
            paragraph.parent.remove(paragraph)


def _google_args(
    app: Any, what: str, name: str, obj: object, options: Any, lines: list[str]
) -> None:
    """A class's or function's "Args:" section becomes its parameter list (napoleon's Google
    style), and nothing else changes: napoleon as an extension would also read a property's
    docstring that starts with "True once ...: ..." as a type followed by a description."""
    if what not in ("class", "exception", "method", "function") or "Args:" not in (
        line.strip() for line in lines
    ):
        return
    from sphinx.ext.napoleon import Config, GoogleDocstring

    config = Config(napoleon_use_rtype=False, napoleon_use_param=True)
    lines[:] = GoogleDocstring(lines, config, app, what, name, obj, options).lines()


def _argparse_directive() -> Any:
    """sphinx-argparse's directive, its output left as argparse wrote it: the help texts name
    options (``--topic``) in plain text, where smart quotes would turn "--" into a dash."""
    from sphinxarg.ext import ArgParseDirective

    class ArgParse(ArgParseDirective):  # type: ignore[misc]
        def run(self) -> list[Any]:
            result: list[Any] = super().run()
            for node in result:
                node["support_smartquotes"] = False
            return result

    return ArgParse


def setup(app: Any) -> None:
    app.add_directive("argparse", _argparse_directive(), override=True)
    app.connect("autodoc-process-docstring", _google_args)
    app.add_domain(_PythonDomain, override=True)
    app.connect("autodoc-process-bases", _drop_object_base)
    app.connect("doctree-read", _drop_empty_bases)
    app.connect("missing-reference", _missing_reference)
