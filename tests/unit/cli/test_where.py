"""``nsq_ha.cli.where``: the address options with the environment's defaults, TLS, the AUTH secret
read from a file (never shown), compression, and the ConnectionConfig they make."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest
import trustme

from nsq_ha.cli import build_parser
from nsq_ha.cli.where import CliError, read_secret, where_of


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["pub", "--topic", "t", *argv])


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSQ_HA_LOOKUPD", raising=False)
    monkeypatch.delenv("NSQ_HA_NSQD", raising=False)


def test_flags_give_the_addresses_and_no_config_by_default() -> None:
    where = where_of(parse("--lookupd", "http://a:4161", "--lookupd", "b:4161"))
    assert (where.lookupd, where.nsqd, where.config) == (["http://a:4161", "b:4161"], [], None)
    assert where.client_kwargs() == {"lookupd": ["http://a:4161", "b:4161"]}
    assert where_of(parse("--nsqd", "n:4150")).client_kwargs() == {"nsqd": ["n:4150"]}


def test_the_environment_gives_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQ_HA_LOOKUPD", " http://a:4161 , http://b:4161,")
    where = where_of(parse())
    assert where.lookupd == ["http://a:4161", "http://b:4161"]
    assert where.from_env
    monkeypatch.delenv("NSQ_HA_LOOKUPD")
    monkeypatch.setenv("NSQ_HA_NSQD", "n1:4150,n2:4150")
    assert where_of(parse()).nsqd == ["n1:4150", "n2:4150"]


def test_a_flag_replaces_both_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSQ_HA_LOOKUPD", "http://env:4161")
    monkeypatch.setenv("NSQ_HA_NSQD", "env:4150")
    where = where_of(parse("--nsqd", "cli:4150"))
    assert (where.lookupd, where.nsqd) == ([], ["cli:4150"])
    where = where_of(parse("--lookupd", "http://cli:4161"))
    assert (where.lookupd, where.nsqd) == (["http://cli:4161"], [])
    with pytest.raises(CliError, match=r"both set") as info:
        where_of(parse())
    assert info.value.code == 2


def test_both_flags_or_none_are_refused() -> None:
    with pytest.raises(CliError, match="not both"):
        where_of(parse("--lookupd", "a:1", "--nsqd", "b:2"))
    with pytest.raises(CliError, match="NSQ_HA_LOOKUPD") as info:
        where_of(parse())
    assert info.value.code == 2
    assert where_of(parse(), required=False).lookupd == []


def test_the_secret_comes_from_a_file_and_is_never_shown(tmp_path: Path) -> None:
    secret_file = tmp_path / "s"
    secret_file.write_bytes(b"hunter2-secret\r\n")
    assert read_secret(secret_file) == b"hunter2-secret"
    config = where_of(parse("--nsqd", "n:1", "--auth-secret-file", str(secret_file))).config
    assert config is not None
    assert config.auth_secret == b"hunter2-secret"
    assert "hunter2" not in repr(config)
    assert "hunter2" not in repr(
        where_of(parse("--nsqd", "n:1", "--auth-secret-file", str(secret_file)))
    )


@pytest.mark.parametrize("content", [None, b"", b"\n"])
def test_a_missing_or_empty_secret_file_is_a_one_line_error(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CliError) as info:
        where_of(parse("--nsqd", "n:1", "--auth-secret-file", str(path)))
    assert info.value.code == 2
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_an_unreadable_secret_file_does_not_show_content(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot read --auth-secret-file"):
        read_secret(tmp_path)  # a directory


def test_tls_options_make_a_verifying_context(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("client")
    cert_file, key_file = tmp_path / "c.pem", tmp_path / "c.key"
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    client.private_key_pem.write_to_path(str(key_file))
    tls = ["--tls-ca", str(ca_file), "--tls-cert", str(cert_file), "--tls-key", str(key_file)]
    config = where_of(parse("--nsqd", "n:1", *tls)).config
    assert config is not None
    assert isinstance(config.tls, ssl.SSLContext)
    assert config.tls.verify_mode == ssl.CERT_REQUIRED
    plain_tls = where_of(parse("--nsqd", "n:1", "--tls")).config
    assert plain_tls is not None
    assert plain_tls.tls is not None


def test_bad_tls_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="TLS files") as info:
        where_of(parse("--nsqd", "n:1", "--tls-ca", str(tmp_path / "missing.pem")))
    assert info.value.code == 2
    with pytest.raises(CliError, match="--tls-key needs --tls-cert"):
        where_of(parse("--nsqd", "n:1", "--tls-key", str(tmp_path / "k")))


def test_compression_options_are_exclusive() -> None:
    config = where_of(parse("--nsqd", "n:1", "--snappy")).config
    assert config is not None
    assert (config.snappy, config.deflate) == (True, False)
    config = where_of(parse("--nsqd", "n:1", "--deflate")).config
    assert config is not None
    assert (config.snappy, config.deflate) == (False, True)
    with pytest.raises(SystemExit) as info:
        parse("--nsqd", "n:1", "--snappy", "--deflate")
    assert info.value.code == 2


@pytest.mark.parametrize("command", [["lookup"], ["tail"], ["pub"], ["topic", "create"]])
def test_every_client_command_has_the_options(command: list[str], tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("x")
    flags = ["--lookupd", "l:1", "--tls", "--auth-secret-file", str(secret), "--deflate"]
    args = build_parser().parse_args([*command, "--topic", "t", *flags])
    where = where_of(args)
    assert where.config is not None
    assert where.config.deflate
    assert where.config.tls is not None
