"""``Security``: TLS, AUTH and compression by names and paths, turned into a ConnectionConfig;
and the ``nsq`` data source's options that fill it. No server needed."""

from __future__ import annotations

import pickle
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from nsq_ha.connection import ConnectionConfig, Security
from nsq_ha.connection.config import DEFAULT_DEFLATE_LEVEL
from nsq_ha.errors import ConfigError
from nsq_ha.spark.options import OptionError, parse_read_options, parse_write_options

L = "http://127.0.0.1:4161"
SECRET = "s3cr3t-value"  # noqa: S105 - a test value, checked never to be shown


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA file, and a client certificate and key it issued."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("client.example")
    paths = {
        "ca": directory / "ca.pem",
        "cert": directory / "client.pem",
        "key": directory / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    return {name: str(path) for name, path in paths.items()}


def test_off_by_default_leaves_the_config_alone() -> None:
    base = ConnectionConfig(client_id="me")
    assert not Security().enabled
    assert Security().apply(base) is base
    assert Security().apply() == ConnectionConfig()


def test_tls_with_a_ca_and_a_client_certificate(pki: dict[str, str]) -> None:
    security = Security(
        tls=True,
        tls_ca_file=pki["ca"],
        tls_cert_file=pki["cert"],
        tls_key_file=pki["key"],
        tls_server_hostname="nsqd.example",
    )
    config = security.apply(ConnectionConfig(client_id="me"))
    assert isinstance(config.tls, ssl.SSLContext)
    assert config.tls.verify_mode == ssl.CERT_REQUIRED
    assert config.tls.check_hostname is True
    assert len(config.tls.get_ca_certs()) == 1  # only the given CA, not the system's
    assert config.tls_server_hostname == "nsqd.example"
    assert config.client_id == "me"  # the rest of the base is kept


def test_auth_and_compression() -> None:
    config = Security(auth_secret=SECRET, compression="deflate", deflate_level=3).apply()
    assert (config.auth_secret, config.allow_plaintext_auth) == (SECRET, False)
    assert (config.snappy, config.deflate, config.deflate_level) == (False, True, 3)
    config = Security(compression="snappy", allow_plaintext_auth=True).apply()
    assert (config.snappy, config.deflate, config.allow_plaintext_auth) == (True, False, True)


def test_the_secret_from_a_file_is_read_when_applied(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    security = Security(auth_secret_file=str(path))  # nothing read yet: may not exist here
    with pytest.raises(ConfigError, match=r"cannot read the AUTH secret file .*No such file"):
        security.apply()
    path.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        security.apply()
    path.write_text(f"{SECRET}\nsecond line\n")
    assert security.apply().auth_secret == SECRET
    path.write_bytes(b"\xff\xfe" + SECRET.encode())
    with pytest.raises(ConfigError, match="not UTF-8") as caught:
        security.apply()
    assert SECRET not in str(caught.value)


def test_the_secret_is_never_shown_and_the_object_pickles() -> None:
    security = Security(tls=True, auth_secret=SECRET, compression="snappy")
    assert SECRET not in repr(security)
    assert "auth_secret='<redacted>'" in repr(security)
    assert repr(Security()) == "Security()"
    assert pickle.loads(pickle.dumps(security)) == security  # noqa: S301 - to executors
    assert SECRET not in repr(security.apply())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tls_ca_file": "/ca.pem"}, "TLS is off"),
        ({"tls": True, "tls_cert_file": "/c.pem"}, "both its certificate and its key"),
        ({"auth_secret": "a", "auth_secret_file": "/f"}, "not both"),
        ({"auth_secret": ""}, "must not be empty"),
        ({"compression": "gzip"}, "none, snappy or deflate"),
        ({"deflate_level": 10}, "from 1 to 9"),
        ({"deflate_level": True}, "from 1 to 9"),
    ],
)
def test_refused_combinations(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Security(**kwargs)


def test_unreadable_tls_files_name_the_file(tmp_path: Path, pki: dict[str, str]) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match=r"CA file .*nope\.pem"):
        Security(tls=True, tls_ca_file=missing).apply()
    with pytest.raises(ConfigError, match=r"client certificate .*nope\.pem"):
        Security(tls=True, tls_cert_file=missing, tls_key_file=pki["key"]).apply()


def test_spark_options_fill_the_endpoints_security(pki: dict[str, str]) -> None:
    raw = {
        "lookupd": L,
        "topic": "t",
        "tlsCaFile": pki["ca"],
        "AUTHSECRET": SECRET,
        "compression": "Deflate",
        "deflateLevel": "2",
    }
    for opts in (parse_read_options(raw), parse_write_options(raw)):
        security = opts.endpoint.security
        assert security == Security(
            tls=True,  # implied by a TLS file
            tls_ca_file=pki["ca"],
            auth_secret=SECRET,
            compression="deflate",
            deflate_level=2,
        )
        assert SECRET not in repr(opts)
    plain = parse_write_options({"lookupd": L, "topic": "t"})
    assert not plain.endpoint.security.enabled


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"compression": "lz4"}, "'compression' must be none, snappy or deflate"),
        ({"deflateLevel": "0"}, "'deflateLevel' must be an integer >= 1"),
        ({"deflateLevel": "10"}, "'deflateLevel' must be from 1 to 9"),
        ({"deflateLevel": "5"}, "'deflateLevel' needs compression=deflate"),
        ({"tls": "false", "tlsCaFile": "/ca.pem"}, "tlsCaFile need tls=true"),
        ({"tls": "maybe"}, "'tls' must be true or false"),
        ({"tlsCertFile": "/c.pem"}, "tlsCertFile/tlsKeyFile"),
        ({"authSecret": "a", "authSecretFile": "/f"}, "authSecret/authSecretFile"),
    ],
)
def test_bad_spark_security_options(extra: dict[str, str], match: str) -> None:
    raw = {"lookupd": L, "topic": "t", **extra}
    for parse in (parse_read_options, parse_write_options):
        with pytest.raises(OptionError, match=match):
            parse(raw)


def test_the_deflate_level_default_is_the_connection_configs() -> None:
    assert Security().deflate_level == DEFAULT_DEFLATE_LEVEL
    assert ConnectionConfig().deflate_level == DEFAULT_DEFLATE_LEVEL
    assert Security(compression="deflate").apply().deflate_level == DEFAULT_DEFLATE_LEVEL
