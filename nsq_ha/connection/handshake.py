"""The connection handshake (§1.1, §1.8, §2.1, §2.2): magic, IDENTIFY, TLS, compression, AUTH.

:class:`Handshake` runs the steps in nsqd's order on an open :class:`StreamTransport` and moves
the shared state machine through them. While an upgrade may still follow, frames are read with
exact-length reads so no byte of the next layer is consumed by the old one.
"""

from __future__ import annotations

import logging
import struct

from nsq_ha.connection.config import ConnectionConfig
from nsq_ha.errors import BrokerError, ConnectionClosedError, HandshakeError, RemoteProtocolError
from nsq_ha.protocol.commands import MAGIC_V2, encode_auth, encode_identify, encode_nop
from nsq_ha.protocol.compression import DeflateCodec, SnappyCodec
from nsq_ha.protocol.frames import OK, Frame, FrameDecoder, FrameType
from nsq_ha.protocol.identify import AuthResponse, Negotiated, parse_auth_response
from nsq_ha.protocol.identify import parse_identify_response as _parse_identify
from nsq_ha.protocol.state import ConnectionStateMachine, ConnState
from nsq_ha.transport import StreamTransport

__all__ = ["Handshake"]

log = logging.getLogger(__name__)

_FRAME_SIZE = struct.Struct(">I")


class Handshake:
    """The handshake of one connection; results land in ``negotiated`` and ``auth``."""

    def __init__(
        self,
        host: str,
        config: ConnectionConfig,
        transport: StreamTransport,
        decoder: FrameDecoder,
        machine: ConnectionStateMachine,
    ) -> None:
        """Prepare to run on an open transport; ``decoder`` and ``machine`` are shared."""
        self._host = host
        self._address = transport.address
        self._config = config
        self._transport = transport
        self._decoder = decoder
        self._machine = machine
        self.negotiated: Negotiated | None = None
        self.auth: AuthResponse | None = None
        #: Socket writes issued.
        self.writes = 0

    async def run(self) -> None:
        """Run every step; on success the state machine is ready to enter READY."""
        config = self._config
        transport = self._transport
        transport.write(MAGIC_V2)
        self._machine.move(ConnState.CONNECTED)
        body = config.to_identify()
        self._write(encode_identify(body, max_body_size=config.max_body_size))
        self._machine.move(ConnState.IDENTIFYING)
        answer = await self._answer(b"IDENTIFY")
        self.negotiated = negotiated = _parse_identify(answer, body)
        log.info(
            "nsqd %s is %s %s: max_rdy_count=%s msg_timeout=%ss tls=%s snappy=%s deflate=%s "
            "auth_required=%s",
            self._address,
            "fork" if negotiated.is_fork else "vanilla",
            negotiated.version,
            negotiated.max_rdy_count,
            negotiated.msg_timeout,
            negotiated.tls_v1,
            negotiated.snappy,
            negotiated.deflate,
            negotiated.auth_required,
        )
        if config.tls is not None and not negotiated.tls_v1:
            raise HandshakeError(f"nsqd {self._address} did not agree to TLS (no TLS config?)")
        if negotiated.tls_v1:
            if config.tls is None:
                raise HandshakeError(f"nsqd {self._address} started TLS that was not asked for")
            self._machine.move(ConnState.TLS_UPGRADE)
            await transport.start_tls(
                config.tls,
                server_hostname=config.tls_server_hostname or self._host,
                handshake_timeout=config.connect_timeout,
            )
            await self._expect_ok("TLS")
        if negotiated.snappy or negotiated.deflate:
            if negotiated.snappy and negotiated.deflate:
                raise HandshakeError("nsqd announced both snappy and deflate")
            name = "snappy" if negotiated.snappy else "deflate"
            if not (config.snappy if negotiated.snappy else config.deflate):
                raise HandshakeError(f"nsqd {self._address} started {name} that was not asked for")
            level = negotiated.deflate_level or config.deflate_level
            if negotiated.deflate and level < 1:
                raise HandshakeError(f"nsqd {self._address} announced deflate level {level}")
            self._machine.move(ConnState.COMPRESSION_UPGRADE)
            if negotiated.snappy:
                transport.enable_compression(SnappyCodec())
            else:
                transport.enable_compression(DeflateCodec(min(level, 9)))
            await self._expect_ok(transport.compression or "compression")
        elif config.snappy or config.deflate:
            log.info("nsqd %s refused compression; continuing uncompressed", self._address)
        if negotiated.auth_required:
            if config.auth_secret is None:
                raise HandshakeError(
                    f"nsqd {self._address} requires AUTH and no auth_secret is set"
                )
            if not transport.tls and not config.allow_plaintext_auth:
                raise HandshakeError(
                    f"nsqd {self._address} asks for AUTH on a plaintext connection; the secret "
                    "was not sent (connect with tls=, or set allow_plaintext_auth=True to send "
                    "it in clear text)"
                )
            self._machine.move(ConnState.AUTHENTICATING)
            self._write(encode_auth(config.auth_secret, max_body_size=config.max_body_size))
            self.auth = parse_auth_response(await self._answer(b"AUTH"))
            log.info(
                "authenticated to %s as %r (%d permissions)",
                self._address,
                self.auth["identity"],
                self.auth["permission_count"],
            )
        elif config.auth_secret is not None:
            log.info("nsqd %s does not require AUTH; the secret was not sent", self._address)

    def _write(self, data: bytes) -> None:
        """Write one handshake command directly (after the state check)."""
        self._machine.check_command(data)
        self._transport.write(data)
        self.writes += 1

    async def _expect_ok(self, layer: str) -> None:
        """Read the ``OK`` nsqd sends through a new layer."""
        answer = await self._answer(b"IDENTIFY")
        if answer != OK:
            raise HandshakeError(f"expected OK after the {layer} upgrade, got {answer[:64]!r}")

    async def _answer(self, command: bytes) -> bytes:
        """Return the next response frame's data; an error frame raises its BrokerError."""
        frame = await self._frame()
        if frame.frame_type is FrameType.ERROR:
            fork = self.negotiated.is_fork if self.negotiated is not None else None
            raise BrokerError.from_frame(
                frame.data, after_command=command, fork=fork if fork is not None else True
            )
        if frame.frame_type is not FrameType.RESPONSE:
            raise RemoteProtocolError(f"nsqd sent a message frame during the {command!r} step")
        return frame.data

    async def _frame(self) -> Frame:
        """Read one frame without reading past it while the stream may still be upgraded."""
        transport = self._transport
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                if frame.is_heartbeat:
                    self._write(encode_nop())
                    continue
                return frame
            if transport.compression is not None:
                data = await transport.read()
                if not data:
                    raise ConnectionClosedError(f"nsqd {self._address} closed during the handshake")
                self._decoder.receive_data(data)
                continue
            header = await transport.read_exactly(_FRAME_SIZE.size)
            self._decoder.receive_data(header)
            self._decoder.next_frame()  # checks the size field before reading that much
            (size,) = _FRAME_SIZE.unpack(header)
            self._decoder.receive_data(await transport.read_exactly(size))
