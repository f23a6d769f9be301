"""Tests say what they check, not which issue asked for it: no test file names an issue or an
issue's item (in a name, a docstring or a comment)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ISSUE_NUMBER = re.compile(r"\b(issue\s*#?\d+|item\s+\d+)\b", re.IGNORECASE)


def test_no_test_file_names_an_issue_number() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line) and path != Path(__file__).resolve()
    ]
    assert found == []
