"""TLS, AUTH and compression described by names and file paths, turned into a ConnectionConfig.

:class:`~nsq_ha.connection.ConnectionConfig` takes an ``ssl.SSLContext`` and the secret itself,
which cannot travel: a Spark task is pickled to an executor, a command line must not carry a
secret. :class:`Security` holds what can: whether to use TLS, the paths of the CA bundle, the
client certificate and key, the AUTH secret or the file it is in, and the compression. It is
a frozen dataclass of strings (pickles as is) whose ``repr`` never shows the secret, and
:meth:`Security.apply` builds the context and reads the files where the connection is made
(the executor, not the driver), so the paths must exist there, as with Kafka's trust stores.
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass
from typing import Literal

from nsq_ha.connection.config import DEFAULT_DEFLATE_LEVEL, ConnectionConfig
from nsq_ha.errors import ConfigError

__all__ = ["Compression", "Security"]

Compression = Literal["none", "snappy", "deflate"]

_REDACTED = "'<redacted>'"


@dataclass(frozen=True, kw_only=True, slots=True)
class Security:
    """How connections to nsqd are secured and compressed (all off by default).

    ``tls``: upgrade every connection to TLS, verifying nsqd's certificate against
    ``tls_ca_file`` (PEM; the system's CAs when None) and its host name (``tls_server_hostname``
    when nsqd's certificate names another host than the one connected to); ``tls_cert_file`` and
    ``tls_key_file``: a client certificate for nsqd's ``--tls-client-auth-policy``.
    ``auth_secret`` or ``auth_secret_file`` (its first line): sent when nsqd asks for AUTH, over
    TLS only unless ``allow_plaintext_auth``. ``compression``: ``snappy`` or ``deflate`` (at
    ``deflate_level`` 1-9) for the connection's frames.
    """

    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_hostname: str | None = None
    auth_secret: str | None = None
    auth_secret_file: str | None = None
    allow_plaintext_auth: bool = False
    compression: Compression = "none"
    deflate_level: int = DEFAULT_DEFLATE_LEVEL

    def __post_init__(self) -> None:
        """Refuse combinations that cannot be meant (each error names the fields)."""
        files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if not self.tls and (any(files) or self.tls_server_hostname):
            raise ConfigError(
                "TLS files or a server host name were given but TLS is off: turn TLS on"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("a client certificate needs both its certificate and its key file")
        if self.auth_secret is not None and self.auth_secret_file is not None:
            raise ConfigError("give the AUTH secret or the file it is in, not both")
        if self.auth_secret is not None and not self.auth_secret:
            raise ConfigError("the AUTH secret must not be empty")
        if self.compression not in ("none", "snappy", "deflate"):
            raise ConfigError(
                f"compression must be none, snappy or deflate, got {self.compression!r}"
            )
        level = self.deflate_level
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 9:
            raise ConfigError(f"the deflate level must be an int from 1 to 9, got {level!r}")

    def __repr__(self) -> str:
        """Every field that is set, with the AUTH secret redacted (its file's path is shown)."""
        shown = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value == item.default:
                continue
            text = _REDACTED if item.name == "auth_secret" else repr(value)
            shown.append(f"{item.name}={text}")
        return f"Security({', '.join(shown)})"

    @property
    def enabled(self) -> bool:
        """True when anything differs from a plain, unauthenticated, uncompressed connection."""
        return self != Security()

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (None without TLS): certificate and host name checked."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS CA file {self.tls_ca_file!r}: {exc}") from None
        if self.tls_cert_file is not None:
            try:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"cannot load the TLS client certificate {self.tls_cert_file!r} / key "
                    f"{self.tls_key_file!r}: {exc}"
                ) from None
        return context

    def secret(self) -> str | None:
        """The AUTH secret: given, or the first line of its file (None when neither)."""
        if self.auth_secret_file is None:
            return self.auth_secret
        try:
            with open(self.auth_secret_file, encoding="utf-8") as file:
                value = file.readline().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the AUTH secret file {self.auth_secret_file!r}: "
                f"{exc.strerror or type(exc).__name__}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"the AUTH secret file {self.auth_secret_file!r} is not UTF-8 text"
            ) from None
        if not value:
            raise ConfigError(f"the AUTH secret file {self.auth_secret_file!r} is empty")
        return value

    def apply(self, config: ConnectionConfig | None = None) -> ConnectionConfig:
        """``config`` (default: a new one) with this TLS, AUTH and compression; raises
        ConfigError when a file cannot be read (the message names it, never the secret)."""
        base = config if config is not None else ConnectionConfig()
        if not self.enabled:
            return base
        return dataclasses.replace(
            base,
            tls=self.ssl_context(),
            tls_server_hostname=self.tls_server_hostname,
            auth_secret=self.secret(),
            allow_plaintext_auth=self.allow_plaintext_auth,
            snappy=self.compression == "snappy",
            deflate=self.compression == "deflate",
            deflate_level=self.deflate_level,
        )
