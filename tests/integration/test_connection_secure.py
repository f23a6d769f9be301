"""TLS, AUTH, snappy and deflate against real servers with TLS and an auth server configured.

The module starts its own single-node vanilla cluster and its own fork cluster, both with
``--tls-cert/--tls-key`` (a trustme CA made here) and ``--auth-http-address`` pointing at a
tiny HTTP auth server run by this module. Every connection therefore has to AUTH; every
upgrade is proven by a PUB/SUB round trip through it.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import AuthFailedError, HandshakeError
from nsq_ha.protocol.session import ConnState
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .auth_server import IDENTITY, IDENTITY_URL, AuthServer, running_auth_server
from .helpers import Subscriber, connect, take
from .publishes import publish

GOOD_SECRET = "let-me-in"  # noqa: S105 - the test auth server's secret
TOPIC = "cs_secure"


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with running_auth_server(GOOD_SECRET) as auth:
        yield auth


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_flags(
    ca: trustme.CA, auth_server: AuthServer, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    directory: Path = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = directory / "server.pem", directory / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return [
        f"--tls-cert={cert_file}",
        f"--tls-key={key_file}",
        f"--auth-http-address={auth_server.address}",
    ]


@pytest.fixture(scope="module")
def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)
    return context


@pytest.fixture(scope="module")
def secure_vanilla(vanilla_binaries: ServerBinaries, server_flags: list[str]) -> Iterator[str]:
    with VanillaCluster(vanilla_binaries, nsqd_args=server_flags, node_count=1) as cluster:
        yield cluster.nodes[0].tcp_address


@pytest.fixture(scope="module")
def secure_fork(fork_binaries: ServerBinaries, server_flags: list[str]) -> Iterator[str]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not on PATH (the fork's cluster needs it)")
    with ForkCluster(fork_binaries, nsqd_args=server_flags, node_count=1) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replicas=1)
        yield cluster.nodes[0].tcp_address


@pytest.fixture(params=["vanilla", "fork"])
def secure_address(request: pytest.FixtureRequest) -> str:
    address: str = request.getfixturevalue(f"secure_{request.param}")
    return address


UPGRADES = {
    "tls": {"tls": True},
    "tls+snappy": {"tls": True, "snappy": True},
    "tls+deflate": {"tls": True, "deflate": True, "deflate_level": 3},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True},
}


def _config(client_tls: ssl.SSLContext, upgrade: dict[str, object]) -> ConnectionConfig:
    options = dict(upgrade)
    tls = client_tls if options.pop("tls", False) else None
    # AUTH goes over TLS by default; the plaintext upgrades must allow it explicitly
    return ConnectionConfig(
        tls=tls,
        auth_secret=GOOD_SECRET,
        allow_plaintext_auth=tls is None,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("upgrade", list(UPGRADES))
async def test_upgrade_round_trip(
    secure_address: str, client_tls: ssl.SSLContext, auth_server: AuthServer, upgrade: str
) -> None:
    """nsqd agrees to the upgrade, sends OK through the new layer(s), AUTH succeeds inside
    them, and a 200 KiB PUB (several snappy blocks / deflate flushes) plus small PUBs come
    back intact on a SUB connection using the same upgrade."""
    config = _config(client_tls, UPGRADES[upgrade])
    queries_before = len(auth_server.queries)
    async with (
        Subscriber(secure_address, config=config) as sub,
        NsqdConnection(secure_address, config=config) as pub,
    ):
        negotiated = pub.negotiated
        assert negotiated.tls_v1 is (config.tls is not None)
        assert negotiated.snappy is config.snappy
        assert negotiated.deflate is config.deflate
        if config.deflate:
            assert negotiated.deflate_level == UPGRADES[upgrade].get("deflate_level", 6)
        assert negotiated.auth_required is True
        assert pub.auth == {
            "identity": IDENTITY,
            "identity_url": IDENTITY_URL,
            "permission_count": 1,
        }
        partition = 0 if pub.is_fork else None
        for layer in upgrade.split("+"):
            assert layer in repr(pub)
        await sub.subscribe(TOPIC, f"ch_{upgrade.replace('+', '_')}", partition)
        sub.rdy(10)
        big = bytes(range(256)) * 800
        await publish(pub, TOPIC, big, partition)
        await asyncio.gather(*(publish(pub, TOPIC, b"s%d" % i, partition) for i in range(3)))
        messages = await take(sub, 4)
        assert [m.body for m in messages] == [big, b"s0", b"s1", b"s2"]
        for message in messages:
            sub.fin(message.id)
    # nsqd tells the auth server whether the client came over TLS
    tls_flags = {q["tls"] for q in auth_server.queries[queries_before:]}
    assert tls_flags == {"true" if config.tls is not None else "false"}


async def test_auth_denied(secure_address: str, auth_server: AuthServer) -> None:
    """A secret the auth server answers 403 for: nsqd sends fatal E_AUTH_FAILED, connect()
    raises it and the connection is closed."""
    bad = ConnectionConfig(auth_secret="wrong", allow_plaintext_auth=True)  # noqa: S106
    conn = NsqdConnection(secure_address, config=bad)
    with pytest.raises(AuthFailedError) as info:
        await conn.connect()
    assert info.value.fatal is True
    assert conn.state is ConnState.CLOSED
    assert any(q.get("secret") == "wrong" for q in auth_server.queries)


async def test_plaintext_auth_refused_without_the_option(
    secure_address: str, auth_server: AuthServer
) -> None:
    """A real nsqd asking for AUTH on a plaintext connection: by default the secret is not
    sent (the auth server never sees it) and the handshake fails with HandshakeError."""
    queries_before = len(auth_server.queries)
    config = ConnectionConfig(auth_secret=GOOD_SECRET)
    with pytest.raises(HandshakeError, match="plaintext"):
        await connect(secure_address, config=config)
    assert auth_server.queries[queries_before:] == []


async def test_auth_required_without_a_secret(secure_address: str) -> None:
    """nsqd announces auth_required; without a secret the client stops at the handshake."""
    with pytest.raises(HandshakeError, match="requires AUTH"):
        await connect(secure_address)


async def test_tls_refused_by_a_server_without_certificates(
    vanilla_cluster: VanillaCluster, client_tls: ssl.SSLContext
) -> None:
    """Asking for TLS from an nsqd without a TLS config: it answers tls_v1 false and the
    client refuses to continue in plain text."""
    with pytest.raises(HandshakeError, match="did not agree to TLS"):
        await connect(vanilla_cluster.nodes[0].tcp_address, config=ConnectionConfig(tls=client_tls))


async def test_tls_with_an_untrusted_certificate_fails(secure_vanilla: str) -> None:
    """A client that does not trust the test CA fails the TLS handshake (HandshakeError)."""
    untrusted = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    config = ConnectionConfig(tls=untrusted, auth_secret=GOOD_SECRET)
    with pytest.raises(HandshakeError, match="TLS failed"):
        await connect(secure_vanilla, config=config)
