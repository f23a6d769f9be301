"""Credentials in URLs: shown redacted, sent apart (pure)."""

from __future__ import annotations

import pytest

from nsq_ha.redact import redact_url, split_credentials


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@host:4161", "http://user:***@host:4161"),
        ("http://token@host:4161", "http://***@host:4161"),
        ("http://u:p@ss@host:4161/x", "http://u:***@host:4161/x"),
        ("https://us%40er:p%40ss@[::1]:4161", "https://us%40er:***@[::1]:4161"),
        ("http://host:4161", "http://host:4161"),
        ("host:4161", "host:4161"),
        ("user:secret@host:4161", "user:***@host:4161"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_split_credentials() -> None:
    assert split_credentials("http://us%40er:p%40ss@127.0.0.1:4161") == (
        "http://127.0.0.1:4161",
        ("us@er", "p@ss"),
    )
    assert split_credentials("http://tok@127.0.0.1:4161") == ("http://127.0.0.1:4161", ("tok", ""))
    assert split_credentials("http://127.0.0.1:4161") == ("http://127.0.0.1:4161", None)
