"""Credentials in URLs: shown redacted, sent apart (pure)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable

import httpx
import pytest

from nsq_ha.lookup.http import Endpoint
from nsq_ha.redact import redact_url


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


def _authorization(endpoint: Endpoint) -> str | None:
    """The Authorization header a request to ``endpoint`` carries."""
    if endpoint.auth is None:
        return None
    request = next(endpoint.auth.auth_flow(httpx.Request("GET", endpoint.url)))
    return request.headers["Authorization"]


def _basic(userinfo: bytes) -> str:
    return "Basic " + base64.b64encode(userinfo).decode()


def test_credentials_are_sent_decoded_as_basic_auth_and_never_in_the_url() -> None:
    endpoint = Endpoint.parse("http://us%40er:p%40ss@127.0.0.1:4161")
    assert (endpoint.url, endpoint.shown) == (
        "http://127.0.0.1:4161",
        "http://us%40er:***@127.0.0.1:4161",
    )
    assert _authorization(endpoint) == _basic(b"us@er:p@ss")
    token = Endpoint.parse("http://tok@127.0.0.1:4161")
    assert (token.url, token.shown) == ("http://127.0.0.1:4161", "http://***@127.0.0.1:4161")
    assert _authorization(token) == _basic(b"tok:")
    plain = Endpoint.parse("http://127.0.0.1:4161")
    assert (plain.url, plain.shown, plain.auth) == ("http://127.0.0.1:4161",) * 2 + (None,)


USERINFO_URL = "http://u:s3cret@127.0.0.1:4161"


def _objects_holding_a_lookupd_url() -> dict[str, object]:
    """Every value whose fields hold lookupd URLs, built with a password in one."""
    from nsq_ha.consumer.config import ConsumerConfig
    from nsq_ha.lookup.http import Endpoint as LookupdEndpoint
    from nsq_ha.producer.config import ProducerConfig
    from nsq_ha.spark.options import parse_read_options, parse_write_options
    from nsq_ha.spark.source.ranges import RangeTask

    read = parse_read_options({"lookupd": USERINFO_URL, "topic": "t", "authSecret": "t0ps3cret"})
    write = parse_write_options({"lookupd": USERINFO_URL, "topic": "t"})
    objects: dict[str, object] = {
        "ProducerConfig": ProducerConfig(lookupd=(USERINFO_URL,)),
        "ConsumerConfig": ConsumerConfig(topic="t", channel="c", lookupd=USERINFO_URL),
        "lookup Endpoint": LookupdEndpoint.parse(USERINFO_URL),
        "ReadOptions": read,
        "WriteOptions": write,
        "spark Endpoint": read.endpoint,
        "RangeTask": RangeTask(
            read.endpoint.lookupd, "t", "c", 0, 0, 10, 5.0, fail_on_data_loss=True
        ),
    }
    try:  # the planned read task Spark shows is a pyspark InputPartition
        from nsq_ha.spark.source.readers import _task
    except ImportError:
        return objects
    objects["planned read task"] = _task(read, "c", ("t", 0), 0, 10)
    return objects


def test_a_lookupd_password_is_in_no_repr_and_the_user_still_is() -> None:
    shown = {
        f"{name} {how}": text
        for name, value in _objects_holding_a_lookupd_url().items()
        for how, text in (("repr", repr(value)), ("str", str(value)))
    }
    leaks = sorted(what for what, text in shown.items() if "s3cret" in text)
    assert not leaks, f"the password is shown by: {', '.join(leaks)}"
    hidden = sorted(what for what, text in shown.items() if "u:***@127.0.0.1:4161" not in text)
    assert not hidden, f"the redacted URL is not shown by: {', '.join(hidden)}"


def test_a_bad_spark_option_beside_a_lookupd_password_does_not_show_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from nsq_ha.spark.options import OptionError, parse_read_options, parse_write_options

    caplog.set_level(logging.DEBUG)
    bad: list[tuple[Callable[[dict[str, str]], object], dict[str, str]]] = [
        (parse_read_options, {"lookupd": USERINFO_URL, "topic": "t", "readTimeout": "soon"}),
        (parse_read_options, {"lookupd": "u:s3cret@", "topic": "t"}),
        (parse_read_options, {"lookupd": USERINFO_URL, "nsqd": "127.0.0.1:4150", "topic": "t"}),
        (parse_write_options, {"lookupd": USERINFO_URL, "topic": "t", "maxBatch": "ten"}),
        (parse_write_options, {"lookupd": "s3cret@host", "topic": "t"}),
    ]
    for parse, options in bad:
        with pytest.raises(OptionError) as caught:
            parse(options)
        assert "s3cret" not in str(caught.value), str(caught.value)
        assert "s3cret" not in repr(caught.value)
    assert "s3cret" not in caplog.text
