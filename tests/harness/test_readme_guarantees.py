"""Every test the promises name exists, so a promise cannot outlive its test.

The promises are the section "What the client promises" of the docs' page on operating the fork
(``docs/operating.md``); the README's Guarantees section summarises them and links there. The
section names tests as `tests/<path>.py::test_name`, continues with `::other_name` for
the same file, and names whole files as `tests/<path>.py` or, in the same folder as the last
one named, `test_<module>.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PROMISES = ROOT / "docs" / "operating.md"
HEADING = "## What the client promises"


def _guarantees() -> str:
    text = PROMISES.read_text(encoding="utf-8")
    start = text.index(f"\n{HEADING}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def named_tests() -> list[tuple[str, str | None]]:
    """(file, test function or None) for each reference, in the order written."""
    refs: list[tuple[str, str | None]] = []
    current: str | None = None
    for token in re.findall(r"`([^`]+)`", _guarantees()):
        match = re.fullmatch(r"((?:tests/[\w/]+/)?test_\w+\.py)?(?:::(\w+)(?:\[[^\]]*\])?)?", token)
        if match is None or not (match.group(1) or match.group(2)):
            continue
        path, name = match.group(1), match.group(2)
        if path is not None:
            if not path.startswith("tests/"):
                assert current is not None, f"{token!r} names a file before any folder"
                path = str(Path(current).parent / path)
            current = path
        assert current is not None, f"{token!r} continues no file"
        refs.append((current, name))
    return refs


def test_the_section_names_tests() -> None:
    assert len(named_tests()) >= 104


def test_the_readme_links_to_the_promises() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    guarantees = readme[readme.index("\n## Guarantees\n") :]
    assert "(docs/operating.md#what-the-client-promises)" in guarantees


def test_every_named_test_exists() -> None:
    missing = []
    for path, name in named_tests():
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
        elif name is not None and not re.search(
            rf"^(?:async )?def {name}\(", file.read_text(encoding="utf-8"), re.MULTILINE
        ):
            missing.append(f"{path}::{name}")
    assert not missing, missing
