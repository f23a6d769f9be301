"""One bounded GET to an nsqlookupd: capped size, no content decoding, credentials apart (the
caller bounds the time). Only ``identity`` is accepted, so a small compressed answer cannot
expand into a big one."""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nsq_ha.errors import ConfigError, RemoteProtocolError
from nsq_ha.lookup.wire import V1_ACCEPT
from nsq_ha.redact import redact_url

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

#: The deadline of an admin call to nsqlookupd or nsqd over HTTP by default, in seconds:
#: :class:`~nsq_ha.admin.LookupdAdmin`'s and :class:`~nsq_ha.admin.NsqdAdmin`'s ``timeout``,
#: each call a consumer's start position or seek makes, ``nsq-ha tail``'s HTTP client.
ADMIN_TIMEOUT = 10.0

_HEADERS = {**V1_ACCEPT, "Accept-Encoding": "identity"}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context (httpx's default: certifi, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) of
    every HTTP client here, built once: a client left to build its own spends 35 to 65 ms of CPU."""
    import httpx

    return httpx.create_ssl_context()


def normalize_lookupd(address: str) -> str:
    """``host:port`` or ``http://host:port[/]`` -> ``http://host:port`` (userinfo kept); a
    refused address is quoted redacted in the :class:`ConfigError`."""
    import httpx

    if not isinstance(address, str):
        raise ConfigError(f"nsqlookupd address must be a string, got {type(address).__name__}")
    addr = address.strip().rstrip("/")
    if not addr:
        raise ConfigError("empty nsqlookupd address")
    if "://" not in addr:
        addr = f"http://{addr}"
    with contextlib.suppress(httpx.InvalidURL):
        url = httpx.URL(addr)
        if url.scheme in ("http", "https") and url.host:
            return addr
    raise ConfigError(
        f"nsqlookupd address must be host:port or an http URL, got {redact_url(address)!r}"
    )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An nsqlookupd base URL as requested (no userinfo), shown (redacted), and its auth."""

    url: str
    shown: str
    auth: httpx.BasicAuth | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, address: str) -> Endpoint:
        """Split ``http://user:secret@host:port`` into the bare URL and basic auth (decoded)."""
        import httpx

        parsed = httpx.URL(address)
        if not parsed.userinfo:
            return cls(address, address)
        bare = str(parsed.copy_with(userinfo=b""))
        return cls(bare, redact_url(address), httpx.BasicAuth(parsed.username, parsed.password))


@dataclass(frozen=True, slots=True)
class Answer:
    """An nsqlookupd answer, whole and under the size cap."""

    status: int
    headers: Mapping[str, str]
    body: bytes


async def get_answer(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    path: str,
    params: Mapping[str, str] | None,
    *,
    max_bytes: int,
) -> Answer:
    """GET ``path`` of ``endpoint``, read by :func:`read_capped` (httpx errors propagate)."""
    import httpx

    where = f"nsqlookupd {endpoint.shown}{path}"
    auth = endpoint.auth if endpoint.auth is not None else httpx.USE_CLIENT_DEFAULT
    request = http.build_request("GET", endpoint.url + path, params=params, headers=_HEADERS)
    response = await http.send(request, auth=auth, stream=True)
    return await read_capped(response, where, max_bytes=max_bytes, limit_name="max_answer_bytes")


async def read_capped(
    response: httpx.Response, where: str, *, max_bytes: int, limit_name: str
) -> Answer:
    """A streamed ``response`` read whole (then closed): an encoded answer, a declared length or
    a body over ``max_bytes`` raise RemoteProtocolError naming ``where`` and ``limit_name``."""
    try:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise RemoteProtocolError(
                f"{where} answered with content-encoding {encoding[:40]!r} (identity was asked)"
            )
        declared = response.headers.get("content-length", "").strip()
        if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
            raise RemoteProtocolError(
                f"{where} announced a {int(declared)}-byte answer, over the limit of "
                f"{max_bytes} bytes ({limit_name})"
            )
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > max_bytes:
                raise RemoteProtocolError(
                    f"{where} answered more than {max_bytes} bytes, over the limit "
                    f"({limit_name}): the rest was not read"
                )
        return Answer(response.status_code, response.headers, bytes(body))
    finally:
        await response.aclose()
