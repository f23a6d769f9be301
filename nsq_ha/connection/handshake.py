"""The connection handshake (§1.1, §1.8, §2.1, §2.2): magic, IDENTIFY, TLS, compression, AUTH.

:func:`handshake` runs the steps in nsqd's order on an open :class:`StreamTransport`; the
:class:`~nsq_ha.protocol.session.ClientSession` encodes each step's command, moves the state and
reads the answers. The transport pushes one read into the session per wait (it holds the socket
until the handshake waits again): no byte may precede TLS, and those that came before
compression was enabled are decompressed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from nsq_ha.connection.config import ConnectionConfig
from nsq_ha.errors import ConnectionClosedError, HandshakeError, NsqError, RemoteProtocolError
from nsq_ha.protocol.commands import Nop
from nsq_ha.protocol.events import HEARTBEAT, NEED_DATA, Answer, Failed
from nsq_ha.protocol.frames import OK
from nsq_ha.protocol.identify import AuthResponse, parse_auth_response
from nsq_ha.protocol.identify import parse_identify_response as _parse_identify
from nsq_ha.protocol.session import ClientSession
from nsq_ha.transport import StreamTransport

if TYPE_CHECKING:
    from nsq_ha.protocol.compression import StreamCodec

log = logging.getLogger(__name__)


def codec_for(name: str, level: int) -> StreamCodec:
    """The stream codec of ``name`` (``"snappy"`` or ``"deflate"`` at ``level``): the codecs,
    and python-snappy, are imported only for a connection nsqd agreed to compress."""
    from nsq_ha.protocol.compression import DeflateCodec, SnappyCodec

    return SnappyCodec() if name == "snappy" else DeflateCodec(min(level, 9))


async def handshake(
    host: str, config: ConnectionConfig, transport: StreamTransport, session: ClientSession
) -> AuthResponse | None:
    """Run every step, return the AUTH answer if AUTH ran; then the session may enter READY."""
    address, loop = transport.address, transport.loop
    woken = asyncio.Event()
    ended: NsqError | bool = False  # the stream ended: True, or the NsqError that ended it

    def received(data: bytes) -> None:  # one read; the socket waits until the handshake waits
        transport.hold()
        try:
            session.receive_data(data, loop.time())  # the heartbeat-flood clock
        except NsqError as exc:
            end(exc)
        woken.set()

    def end(error: NsqError | None) -> None:
        nonlocal ended
        ended = True if error is None else error
        woken.set()

    async def answer(step: str) -> bytes:
        """The next answer's data (heartbeats answered meanwhile); an error frame raises."""
        while (event := session.next_event()) is NEED_DATA or event is HEARTBEAT:
            if event is HEARTBEAT:
                transport.send_now(session.send_nowait(Nop()))
            elif isinstance(ended, NsqError):
                raise ended
            elif ended:
                raise ConnectionClosedError(f"nsqd {address} closed during the handshake")
            else:
                woken.clear()
                transport.release()
                await woken.wait()
        if isinstance(event, Failed):
            raise event.error
        if not isinstance(event, Answer):
            raise RemoteProtocolError(f"nsqd sent {event!r} during the {step} step")
        return event.data

    async def expect_ok(layer: str) -> None:  # the OK nsqd sends through a new layer
        data = await answer(layer)
        if data != OK:
            raise HandshakeError(f"expected OK after the {layer} upgrade, got {data[:64]!r}")

    transport.receive(received, end)
    transport.send_now(session.start())
    body = config.to_identify()
    transport.send_now(session.identify(body, max_body_size=config.max_body_size))
    negotiated = _parse_identify(await answer("IDENTIFY"), body)
    session.identified(negotiated)
    keys = ("max_rdy_count", "msg_timeout", "tls_v1", "snappy", "deflate", "auth_required")
    shown = " ".join(f"{key}={getattr(negotiated, key)}" for key in keys)
    kind = "fork" if negotiated.is_fork else "vanilla"
    log.info("nsqd %s is %s %s: %s", address, kind, negotiated.version, shown)
    if config.tls is not None and not negotiated.tls_v1:
        raise HandshakeError(f"nsqd {address} did not agree to TLS (no TLS config?)")
    if negotiated.tls_v1:
        if config.tls is None:
            raise HandshakeError(f"nsqd {address} started TLS that was not asked for")
        session.start_tls()
        await transport.start_tls(
            config.tls,
            server_hostname=config.tls_server_hostname or host,
            handshake_timeout=config.connect_timeout,
        )
        await expect_ok("TLS")
    if negotiated.snappy or negotiated.deflate:
        if negotiated.snappy and negotiated.deflate:
            raise HandshakeError("nsqd announced both snappy and deflate")
        name = "snappy" if negotiated.snappy else "deflate"
        if not (config.snappy if negotiated.snappy else config.deflate):
            raise HandshakeError(f"nsqd {address} started {name} that was not asked for")
        level = negotiated.deflate_level or config.deflate_level
        if negotiated.deflate and level < 1:
            raise HandshakeError(f"nsqd {address} announced deflate level {level}")
        transport.enable_compression(codec_for(name, level), session.start_compression())
        await expect_ok(transport.compression or "compression")
    elif config.snappy or config.deflate:
        log.info("nsqd %s refused compression; continuing uncompressed", address)
    if not negotiated.auth_required:
        if config.auth_secret is not None:
            log.info("nsqd %s does not require AUTH; the secret was not sent", address)
        return None
    if config.auth_secret is None:
        raise HandshakeError(f"nsqd {address} requires AUTH and no auth_secret is set")
    if not transport.tls and not config.allow_plaintext_auth:
        raise HandshakeError(
            f"nsqd {address} asks for AUTH on a plaintext connection; the secret was not sent "
            "(connect with tls=, or set allow_plaintext_auth=True to send it in clear text)"
        )
    transport.send_now(session.authenticate(config.auth_secret, max_body_size=config.max_body_size))
    auth = parse_auth_response(await answer("AUTH"))
    identity, rights = auth["identity"], auth["permission_count"]
    log.info("authenticated to %s as %r (%d permissions)", address, identity, rights)
    return auth
