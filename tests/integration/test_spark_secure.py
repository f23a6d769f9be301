"""The ``nsq`` data source on secured clusters: TLS (a CA made here), AUTH (the fork asks a
small auth server run here) and snappy/deflate, given as options, applied in every task.

Backends: the embedded cluster with TLS (it has no AUTH: it never asks for it), and a
one-node fork cluster with ``--tls-cert/--tls-key`` and ``--auth-http-address``, on which
every connection has to AUTH (and AUTH goes over TLS only). Each: a keyed batch write and a
batch read of the same rows back, each with a different compression; the same read with a CA
that did not sign nsqd's certificate fails (so TLS is really verified on the executors); on
the fork, a write without TLS fails (the secret is not sent in clear text) and the auth
server saw the secret over TLS. Marked ``spark``.
"""

from __future__ import annotations

import os
import shutil
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import SparkSession  # noqa: E402

from nsq_ha.connection import Security  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402
from nsq_ha.testing.build import ServerBinaries  # noqa: E402
from nsq_ha.testing.servers import ForkCluster, VanillaCluster  # noqa: E402

from .auth_server import AuthServer, running_auth_server  # noqa: E402
from .spark_session import local_spark  # noqa: E402

pytestmark = pytest.mark.spark

SECRET = "spark-may-pass"  # noqa: S105 - the test auth server's secret
ROWS = 3000


@dataclass
class Secured:
    """A secured backend and the options a Spark job needs to reach it."""

    name: str
    lookupd: str
    topic: str
    options: dict[str, str]
    auth: AuthServer | None = None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """nsqd's certificate and key, the CA that signed them, and another CA."""
    directory: Path = tmp_path_factory.mktemp("spark_tls")
    ca, stranger = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    files = {name: directory / name for name in ("server.pem", "server.key", "ca.pem", "x.pem")}
    cert.cert_chain_pems[0].write_to_path(str(files["server.pem"]))
    cert.private_key_pem.write_to_path(str(files["server.key"]))
    ca.cert_pem.write_to_path(str(files["ca.pem"]))
    stranger.cert_pem.write_to_path(str(files["x.pem"]))
    secret = directory / "secret"
    secret.write_text(SECRET + "\n")
    return {**{k: str(v) for k, v in files.items()}, "secret": str(secret)}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with local_spark("nsq_ha-secure-tests") as session:
        yield session


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with running_auth_server(SECRET) as auth:
        yield auth


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def secured(
    request: pytest.FixtureRequest, pki: dict[str, str], auth_server: AuthServer
) -> Iterator[Secured]:
    topic = "sp_secure"
    tls = {"tlsCaFile": pki["ca.pem"]}
    if request.param == "devcluster":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pki["server.pem"], pki["server.key"])
        with DevClusterThread(nodes=1, tls_context=context) as dev:
            dev.create_topic(topic, partitions=2, replicas=1)
            yield Secured("devcluster", dev.lookupd_http, topic, tls)
        return
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not on PATH (the fork's cluster needs it)")
    binaries: ServerBinaries = request.getfixturevalue("fork_binaries")
    flags = [
        f"--tls-cert={pki['server.pem']}",
        f"--tls-key={pki['server.key']}",
        f"--auth-http-address={auth_server.address}",
    ]
    with ForkCluster(binaries, nsqd_args=flags, node_count=1) as cluster:
        cluster.create_topic(topic, partitions=2, replicas=1)
        options = {**tls, "authSecretFile": pki["secret"]}
        yield Secured("fork", cluster.lookupd_http, topic, options, auth_server)


def _write(spark: SparkSession, where: Secured, tag: str, **options: str) -> None:
    rows = [(f"{tag}-{i:05d}", f"k{i % 7}") for i in range(ROWS)]
    frame = spark.createDataFrame(rows, "body string, key string").repartition(2)
    writer = frame.write.format("nsq").mode("append")
    for key, value in {"lookupd": where.lookupd, "topic": where.topic, **options}.items():
        writer = writer.option(key, value)
    writer.option("keyColumn", "key").save()


def _read(spark: SparkSession, where: Secured, **options: str) -> list[str]:
    reader = spark.read.format("nsq")
    for key, value in {"lookupd": where.lookupd, "topic": where.topic, **options}.items():
        reader = reader.option(key, value)
    return sorted(bytes(r["body"]).decode() for r in reader.load().select("body").collect())


def test_write_and_read_back_over_tls_auth_and_compression(
    spark: SparkSession, secured: Secured, pki: dict[str, str]
) -> None:
    tag = f"sec{os.getpid()}"
    queries_before = len(secured.auth.queries) if secured.auth else 0
    _write(spark, secured, tag, **secured.options, compression="snappy")
    got = [b for b in _read(spark, secured, **secured.options, compression="deflate") if tag in b]
    assert got == [f"{tag}-{i:05d}" for i in range(ROWS)]
    if secured.auth is not None:  # every connection authenticated, over TLS
        seen = secured.auth.queries[queries_before:]
        assert seen, "nsqd never asked the auth server"
        assert all(q.get("secret") == SECRET and q.get("tls") == "true" for q in seen), seen
    # a CA that did not sign nsqd's certificate: the executors verify it and refuse, reading
    # and writing
    wrong = {**secured.options, "tlsCaFile": pki["x.pem"]}
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _read(spark, secured, **wrong)
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _write(spark, secured, "refused", **wrong)


def test_the_fork_refuses_a_write_without_tls_and_the_secret_stays_home(
    spark: SparkSession, secured: Secured
) -> None:
    if secured.auth is None:
        pytest.skip("the embedded cluster has no AUTH (it never asks for it)")
    queries_before = len(secured.auth.queries)
    plain = {"authSecretFile": secured.options["authSecretFile"]}
    with pytest.raises(Exception, match="AUTH") as caught:
        _write(spark, secured, "plain", **plain)
    assert SECRET not in str(caught.value)
    assert len(secured.auth.queries) == queries_before  # the secret was never sent


def test_the_driver_source_reads_vanilla_over_tls_and_auth(
    spark: SparkSession,
    vanilla_binaries: ServerBinaries,
    pki: dict[str, str],
    auth_server: AuthServer,
    tmp_path: Path,
) -> None:
    """``mode=driver`` (vanilla nsqd with TLS and AUTH): the driver's own consumer uses the
    options too."""
    flags = [
        f"--tls-cert={pki['server.pem']}",
        f"--tls-key={pki['server.key']}",
        f"--auth-http-address={auth_server.address}",
    ]
    security = {"tlsCaFile": pki["ca.pem"], "authSecretFile": pki["secret"]}
    total = 500
    with VanillaCluster(vanilla_binaries, nsqd_args=flags, node_count=1) as cluster:
        nsqd = cluster.nodes[0].tcp_address
        config = Security(tls=True, tls_ca_file=pki["ca.pem"], auth_secret=SECRET).apply()
        with Producer(nsqd=nsqd, connection=config) as producer:
            producer.publish_many("sp_secure_v", [f"v{i:04d}".encode() for i in range(total)])
        reader = spark.readStream.format("nsq")
        options = {
            "nsqd": nsqd,
            "topic": "sp_secure_v",
            "channel": "spark",
            "walPath": str(tmp_path / "wal"),
            "compression": "snappy",
            **security,
        }
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.format("memory")
            .queryName("secure_driver")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                seen = spark.sql("SELECT count(DISTINCT body) AS n FROM secure_driver").first()
                if seen is not None and seen["n"] >= total:
                    break
                assert query.exception() is None, query.exception()
                time.sleep(0.5)
        finally:
            query.stop()
        rows = spark.sql("SELECT DISTINCT CAST(body AS STRING) AS b FROM secure_driver").collect()
        assert sorted(r["b"] for r in rows) == [f"v{i:04d}" for i in range(total)]
