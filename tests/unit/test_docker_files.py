"""Structural checks of docker/: the compose cluster, the Dockerfile's pins, create-topics.sh.

Docker cannot run on the development machine, so nothing here builds or starts a container; these
tests pin down what can be checked without it: the compose topology and the addresses clients
will be given, the build recipe against ``nsq_ha.testing.build.FORK``, and the topic script.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from nsq_ha.testing.build import FORK

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
BUILD_SCRIPT = DOCKER / "build-fork.sh"
TOPICS_SCRIPT = DOCKER / "create-topics.sh"

NSQDS = ("nsqd1", "nsqd2", "nsqd3")
SERVICES = {"etcd", "nsqlookupd", *NSQDS, "topics", "nsqadmin"}
MIN_NOFILE = 100_000  # nsqd refuses to start below 2 * reservedFDNum (50000, unpatched)


# -- helpers --------------------------------------------------------------------------------


_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:(?P<op>:?[-?+])(?P<arg>[^${}]*))?\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: dict[str, str]) -> str:
    """``docker compose``'s variable interpolation (compose spec, the forms without nesting):
    ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
    ``${VAR?error}``, ``${VAR:+alternative}``, ``${VAR+alternative}``."""

    def one(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        op, arg = m.group("op"), m.group("arg") or ""
        value = env.get(name)
        if op is None:
            return value or ""
        is_set = value is not None and (value != "" or not op.startswith(":"))
        if op.endswith("-"):
            return value if is_set and value is not None else arg
        if op.endswith("+"):
            return arg if is_set else ""
        if not is_set or value is None:
            raise ValueError(f"${{{name}}}: {arg}")
        return value

    out = _VARIABLE.sub(one, text)
    assert "${" not in out.replace("$$", ""), "a variable form this helper does not know"
    return out


def load_compose(env: dict[str, str]) -> dict[str, Any]:
    """compose.yaml as ``docker compose config`` would read it with ``env`` as the environment."""
    doc = yaml.safe_load(interpolate(COMPOSE.read_text(), env))
    assert isinstance(doc, dict), "compose.yaml is not a mapping"
    assert isinstance(doc.get("services"), dict), "compose.yaml has no services mapping"
    return doc


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """With no variable set: the defaults, which the tests below hold to."""
    return load_compose({})


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]


def flag(service: dict[str, Any], name: str) -> str | None:
    """The value of ``--name=value`` in the service's command (``None`` when absent)."""
    values = [a.split("=", 1)[1] for a in command(service) if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given {len(values)} times: {command(service)}"
    return values[0] if values else None


def port_of(address: str) -> int:
    """Port of ``host:port``, ``:port``, ``port`` or ``http://host:port``."""
    if "://" in address:
        port = urlsplit(address).port
        assert port is not None, f"no port in {address!r}"
        return port
    return int(address.rsplit(":", 1)[-1])


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``(host_ip, host_port, container_port)`` of every published port (short or long form)."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            host_ip = str(entry.get("host_ip", ""))
            out.append((host_ip, int(entry["published"]), int(entry["target"])))
            continue
        spec = str(entry).split("/", 1)[0]
        parts = spec.split(":")
        assert len(parts) in (2, 3), f"published port {entry!r} does not name a host port"
        host_ip = parts[0] if len(parts) == 3 else ""
        out.append((host_ip, int(parts[-2]), int(parts[-1])))
    return out


def namespace_owner(services: dict[str, dict[str, Any]], name: str) -> str:
    """The service whose network namespace ``name`` uses (itself unless ``service:X``)."""
    mode = services[name].get("network_mode", "")
    return mode.split(":", 1)[1] if mode.startswith("service:") else name


def dockerfile_args() -> dict[str, str | None]:
    """Default of every ``ARG`` (``None`` for an ARG without default), quotes removed."""
    args: dict[str, str | None] = {}
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?\s*$", line)
        if m:
            value = m.group(2)
            if value is not None:
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                    value = value[1:-1]
            args[m.group(1)] = value
    return args


def code_lines(path: Path) -> list[str]:
    """Lines that are not comments (leading ``#``), so prose may name what code must not do."""
    return [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]


def run_topics_script(topics: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("LOOKUPD", "TOPICS", "DRY_RUN")}
    full.update(env, TOPICS=topics, DRY_RUN="1")
    return subprocess.run(
        ["/bin/sh", str(TOPICS_SCRIPT)],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- compose: services and nsqd settings --------------------------------------------------------


def test_service_set(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES, (
        f"compose services are {sorted(services)}, expected exactly {sorted(SERVICES)}"
    )


@pytest.mark.parametrize("name", NSQDS)
def test_nsqd_open_files_limit_is_raised(services: dict[str, dict[str, Any]], name: str) -> None:
    nofile = (services[name].get("ulimits") or {}).get("nofile")
    assert nofile is not None, f"{name} has no ulimits.nofile: the unpatched nsqd would not start"
    if isinstance(nofile, int):
        soft = hard = nofile
    else:
        soft, hard = int(nofile.get("soft", 0)), int(nofile.get("hard", 0))
    assert soft >= MIN_NOFILE, f"{name} nofile soft limit {soft} < {MIN_NOFILE}"
    assert hard >= MIN_NOFILE, f"{name} nofile hard limit {hard} < {MIN_NOFILE}"
    assert soft <= hard, f"{name} nofile soft {soft} > hard {hard}"


def test_nsqd_run_in_cluster_mode_with_distinct_worker_ids(
    services: dict[str, dict[str, Any]],
) -> None:
    ids = {}
    for name in NSQDS:
        cmd = command(services[name])
        assert cmd[:1] == ["nsqd"], f"{name} does not run nsqd: {cmd}"
        worker = flag(services[name], "worker-id")
        assert worker is not None, f"{name} has no --worker-id"
        ids[name] = int(worker)
        for needed in ("rpc-port", "cluster-id", "cluster-leadership-addresses", "data-path"):
            assert flag(services[name], needed), f"{name} lacks --{needed} (cluster mode)"
        mounts = [str(v).split(":")[1] for v in services[name].get("volumes", [])]
        assert flag(services[name], "data-path") in mounts, (
            f"{name} --data-path is not on a volume ({mounts}): data would die with the container"
        )
    assert len(set(ids.values())) == len(ids), f"worker ids are not distinct: {ids}"


def test_lookupd_runs_in_cluster_mode(services: dict[str, dict[str, Any]]) -> None:
    lookupd = services["nsqlookupd"]
    assert command(lookupd)[:1] == ["nsqlookupd"], f"nsqlookupd runs {command(lookupd)}"
    assert flag(lookupd, "rpc-port"), "nsqlookupd has no --rpc-port (cluster mode)"
    assert flag(lookupd, "allow-write-with-nochannels") == "true", (
        "without --allow-write-with-nochannels=true a new topic is not writable until a consumer "
        "created a channel, and the topics step would wait forever"
    )
    cluster_ids = {flag(services[n], "cluster-id") for n in ("nsqlookupd", *NSQDS)}
    assert len(cluster_ids) == 1, f"lookupd and nsqd use different --cluster-id: {cluster_ids}"


# -- compose: etcd ------------------------------------------------------------------------------


def test_etcd_serves_the_v2_api_and_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    etcd = services["etcd"]
    assert flag(etcd, "enable-v2") == "true", "etcd must run with --enable-v2=true (fork uses v2)"
    test = " ".join(str(t) for t in (etcd.get("healthcheck") or {}).get("test", []))
    assert "/v2/" in test, f"etcd healthcheck should probe the v2 API, it runs: {test!r}"


def test_cluster_leadership_addresses_point_at_etcd(services: dict[str, dict[str, Any]]) -> None:
    etcd = services["etcd"]
    advertised = set((flag(etcd, "advertise-client-urls") or "").split(","))
    listening = {port_of(u) for u in (flag(etcd, "listen-client-urls") or "").split(",") if u}
    users = [n for n in services if flag(services[n], "cluster-leadership-addresses")]
    assert set(users) == {"nsqlookupd", *NSQDS}, f"services in cluster mode: {sorted(users)}"
    for name in users:
        for url in (flag(services[name], "cluster-leadership-addresses") or "").split(","):
            host = urlsplit(url).hostname
            if host == "etcd":
                assert port_of(url) in listening, f"{name}: {url} is not an etcd client port"
            else:
                assert host in ("127.0.0.1", "localhost"), f"{name}: {url} is not etcd"
                assert namespace_owner(services, name) == "etcd", (
                    f"{name} reaches etcd at {url} but does not share etcd's network namespace"
                )
                assert url in advertised, f"{name}: {url} is not etcd's client URL {advertised}"
                assert port_of(url) in listening, f"etcd does not listen on {url}"


# -- compose: ports and addresses ----------------------------------------------------------------


def test_published_host_ports_are_distinct(services: dict[str, dict[str, Any]]) -> None:
    seen: dict[int, str] = {}
    for name, svc in services.items():
        for _, host_port, _ in published(svc):
            assert host_port not in seen, (
                f"host port {host_port} published by both {seen[host_port]} and {name}"
            )
            seen[host_port] = name
    assert seen, "no port is published: clients on the host could not reach the cluster"


def test_listen_ports_do_not_collide_in_a_shared_namespace(
    services: dict[str, dict[str, Any]],
) -> None:
    by_namespace: dict[str, dict[int, str]] = {}
    for name, svc in services.items():
        ports = []
        for f in ("tcp-address", "http-address", "https-address", "metric-address", "rpc-port"):
            value = flag(svc, f)
            if value:
                ports.append((f, port_of(value)))
        for f in ("listen-client-urls", "listen-peer-urls"):
            for url in filter(None, (flag(svc, f) or "").split(",")):
                ports.append((f, port_of(url)))
        used = by_namespace.setdefault(namespace_owner(services, name), {})
        for what, port in ports:
            where = f"{name} --{what}"
            assert port not in used, f"port {port} is used by {used[port]} and by {where}"
            used[port] = where


@pytest.mark.parametrize("name", NSQDS)
def test_nsqd_addresses_in_lookup_answers_work_from_the_host(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    svc = services[name]
    broadcast = flag(svc, "broadcast-address")
    assert broadcast == "127.0.0.1", f"{name} broadcasts {broadcast!r}; clients get that address"
    assert flag(svc, "broadcast-interface") in ("lo", ""), (
        f"{name}: the fork prefers --broadcast-interface (default eth0) over --broadcast-address"
    )
    owner = namespace_owner(services, name)
    mapped = {(h, c) for ip, h, c in published(services[owner]) if ip in ("127.0.0.1", "")}
    for f in ("tcp-address", "http-address"):
        value = flag(svc, f)
        assert value, f"{name} has no --{f}"
        host = value.rsplit(":", 1)[0]
        assert host in ("0.0.0.0", ""), (  # noqa: S104 - the container must accept published traffic
            f"{name} --{f}={value}: published traffic arrives on the namespace's eth0"
        )
        port = port_of(value)
        assert (port, port) in mapped, (
            f"{name} --{f} port {port} is not published 1:1 on the host by {owner} ({mapped}): "
            f"lookup answers would name 127.0.0.1:{port}"
        )


def test_lookupd_http_is_published(services: dict[str, dict[str, Any]]) -> None:
    port = port_of(flag(services["nsqlookupd"], "http-address") or "")
    owner = namespace_owner(services, "nsqlookupd")
    assert port == 4161, f"nsqlookupd HTTP is on {port}; the README promises 4161"
    assert (port, port) in {(h, c) for _, h, c in published(services[owner])}, (
        f"nsqlookupd HTTP {port} is not published 1:1 on the host by {owner}"
    )


# -- compose: start order and the topics step -----------------------------------------------------


def depends(svc: dict[str, Any]) -> dict[str, str]:
    dep = svc.get("depends_on") or {}
    if isinstance(dep, list):
        return dict.fromkeys(dep, "service_started")
    return {k: (v or {}).get("condition", "service_started") for k, v in dep.items()}


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("nsqlookupd", {"etcd"}),
        *((n, {"etcd", "nsqlookupd"}) for n in NSQDS),
        ("topics", {"nsqlookupd", *NSQDS}),
    ],
)
def test_depends_on_healthy(
    services: dict[str, dict[str, Any]], name: str, needs: set[str]
) -> None:
    got = depends(services[name])
    for dep in needs:
        assert got.get(dep) == "service_healthy", (
            f"{name} should wait for {dep} to be healthy, depends_on is {got}"
        )
        assert services[dep].get("healthcheck", {}).get("test"), f"{dep} has no healthcheck"


def test_topics_service_runs_the_script_once(services: dict[str, dict[str, Any]]) -> None:
    topics = services["topics"]
    assert "create-topics.sh" in " ".join(command(topics)), f"topics runs {command(topics)}"
    assert str(topics.get("restart", "no")) == "no", "the topics step is one-shot"
    env = topics.get("environment") or {}
    assert "orders:4:2:ordered events:2:2" in str(env.get("TOPICS")), (
        f"default TOPICS is {env.get('TOPICS')!r}"
    )
    lookupd_port = port_of(flag(services["nsqlookupd"], "http-address") or "")
    assert env.get("LOOKUPD") == f"http://127.0.0.1:{lookupd_port}", f"LOOKUPD={env.get('LOOKUPD')}"
    assert namespace_owner(services, "topics") == namespace_owner(services, "nsqlookupd")


# -- Dockerfile and the build script --------------------------------------------------------------


def test_dockerfile_pins_equal_the_fork_recipe() -> None:
    args = dockerfile_args()
    expected = {
        "FORK_MODULE": FORK.module,
        "FORK_VERSION": FORK.version,
        "FORK_EXPECTED_VERSION": FORK.expected_version,
        "EXTRA_REQUIRES": " ".join(f"{mod}@{ver}" for mod, ver in FORK.extra_requires),
        "GO_LDFLAGS": FORK.ldflags,
        "GO_DIRECTIVE": FORK.go_directive,
        "FORK_PROGRAMS": " ".join(FORK.programs.values()),
        "FORK_COMMIT": FORK.archive.commit if FORK.archive else None,
        "FORK_ARCHIVE_SHA256": FORK.archive.sha256 if FORK.archive else None,
        "FORK_ARCHIVE": "",
    }
    assert FORK.archive is not None
    assert FORK.version.endswith(FORK.archive.commit[:12]), "the recipe's version and commit differ"
    for name, want in expected.items():
        assert args.get(name) == want, (
            f"Dockerfile ARG {name} defaults to {args.get(name)!r}; the FORK recipe says {want!r}"
        )
    assert ("github.com/modern-go/reflect2", "v1.0.2") in FORK.extra_requires


def test_dockerfile_go_version_accepts_checklinkname() -> None:
    version = dockerfile_args().get("GO_VERSION") or ""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", version)
    assert m, f"GO_VERSION {version!r} is not a Go release"
    assert (int(m.group(1)), int(m.group(2))) >= (1, 23), (
        f"GO_VERSION {version}: -checklinkname=0 needs Go >= 1.23"
    )
    assert re.search(r"^FROM golang:\$\{GO_VERSION\}\S* AS build", DOCKERFILE.read_text(), re.M)


def test_dockerfile_builds_from_the_pinned_source_without_patching() -> None:
    for path in (DOCKERFILE, BUILD_SCRIPT):
        for line in code_lines(path):
            assert "reservedFDNum" not in line, f"{path.name} patches the source: {line.strip()}"
            assert not re.search(r"\bsed\b.*\s-i|\bpatch\b\s", line), (
                f"{path.name} edits files in place: {line.strip()}"
            )
            assert "proxy.golang" not in line, f"{path.name} names a proxy: {line.strip()}"
            assert not re.search(r"GOPROXY=\S", line), f"{path.name} sets GOPROXY: {line.strip()}"
    assert dockerfile_args().get("GOPROXY", "unset") is None, "ARG GOPROXY must have no default"
    sources = []
    for line in code_lines(DOCKERFILE):
        if line.startswith("COPY") and "--from=" not in line:
            sources += [w for w in line.split()[1:-1] if not w.startswith("--")]
    assert set(sources) <= {"build-fork.sh", "create-topics.sh", "*.tar.gz"}, (
        f"Dockerfile copies {sources}: only the scripts and a source archive placed by the user"
    )
    script = BUILD_SCRIPT.read_text()
    assert "go mod download" not in script, "the fork must not come from the module proxy"
    assert '"-replace=$FORK_MODULE=./src"' in script
    assert 'sha256sum "$FORK_ARCHIVE"' in script
    assert 'fetch -q --depth 1 "$FORK_GIT_URL" "$FORK_COMMIT"' in script
    assert '-ldflags="$GO_LDFLAGS"' in script
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "docker/*.tar.gz" in ignored, "a source archive placed in docker/ must not be committed"


def _build_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FORK_VERSION": FORK.version}
    full.update(env)
    return subprocess.run(
        ["/bin/sh", str(BUILD_SCRIPT), str(tmp_path / "out")],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_build_script_refuses_an_archive_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    assert FORK.archive is not None
    archive = tmp_path / "fake.tar.gz"
    archive.write_bytes(b"not the fork")
    proc = _build_script(
        tmp_path, FORK_ARCHIVE=str(archive), FORK_ARCHIVE_SHA256=FORK.archive.sha256
    )
    assert proc.returncode == 1
    assert f"expected {FORK.archive.sha256}" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_build_script_needs_an_archive_or_a_commit(tmp_path: Path) -> None:
    proc = _build_script(tmp_path)
    assert proc.returncode == 1
    assert "set FORK_ARCHIVE (a source .tar.gz) or FORK_COMMIT (to clone)" in proc.stderr


def test_dockerfile_final_stage_is_the_slim_nsq_image() -> None:
    froms = [ln.split() for ln in code_lines(DOCKERFILE) if ln.startswith("FROM ")]
    assert froms, "Dockerfile has no FROM"
    last = froms[-1]
    assert re.fullmatch(r"debian:\S+-slim", last[1]), f"final stage is {last}, not slim Debian"
    text = DOCKERFILE.read_text()
    assert re.search(r"COPY --from=build /out/nsqd /out/nsqlookupd ", text), "binaries not copied"
    assert re.search(r"^USER (?!root\b)\S+", text.split(froms[-1][1], 1)[1], re.M), (
        "the final image should not run as root"
    )


# -- create-topics.sh -------------------------------------------------------------------------


@pytest.mark.parametrize("script", [TOPICS_SCRIPT, BUILD_SCRIPT], ids=lambda p: p.name)
def test_scripts_pass_sh_n(script: Path) -> None:
    proc = subprocess.run(
        ["/bin/sh", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, f"/bin/sh -n {script.name}: {proc.stderr}"
    assert script.read_text().startswith("#!/bin/sh\n"), f"{script.name} is not a POSIX sh script"


def test_dry_run_prints_the_create_urls() -> None:
    proc = run_topics_script("orders:4:2:ordered events:2:2")
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert proc.stdout.splitlines() == [
        "http://127.0.0.1:4161/topic/create"
        "?topic=orders&partition_num=4&replicator=2&multipart=true&orderedmulti=true",
        "http://127.0.0.1:4161/topic/create"
        "?topic=events&partition_num=2&replicator=2&multipart=true",
    ], f"dry run printed:\n{proc.stdout}"


def test_dry_run_options_and_lookupd() -> None:
    proc = run_topics_script(
        "  audit:1:3:ext\n  ledger:8:2:ordered:ext ", LOOKUPD="http://lookupd.example:4161/"
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert proc.stdout.splitlines() == [
        "http://lookupd.example:4161/topic/create"
        "?topic=audit&partition_num=1&replicator=3&multipart=true&extend=true",
        "http://lookupd.example:4161/topic/create"
        "?topic=ledger&partition_num=8&replicator=2&multipart=true&orderedmulti=true&extend=true",
    ], f"dry run printed:\n{proc.stdout}"


@pytest.mark.parametrize(
    "topics",
    [
        "orders:4",  # no replicas
        "orders:0:1",  # partitions 1..254
        "orders:255:1",
        "orders:04:1",  # leading zero
        "orders:4:6",  # replicas 1..5
        "orders:x:1",
        "ord*rs:4:1",  # name rule (and no globbing)
        ":4:1",
        "orders:4:2:sorted",  # unknown option
        "ok:1:1 bad:1:1:nope",  # all validated before anything is printed
        "",
    ],
)
def test_dry_run_rejects_bad_topics(topics: str) -> None:
    proc = run_topics_script(topics)
    assert proc.returncode == 2, f"TOPICS={topics!r}: exit {proc.returncode}, {proc.stdout}"
    assert proc.stdout == "", f"TOPICS={topics!r} printed {proc.stdout!r} before failing"
    assert proc.stderr.strip(), f"TOPICS={topics!r} failed without a message"


@pytest.mark.skipif(shutil.which("dash") is None, reason="dash is not installed")
def test_dry_run_under_dash() -> None:
    """Debian's /bin/sh in the image is dash; run the parsing with it explicitly too."""
    env = dict(os.environ, TOPICS="orders:4:2:ordered", DRY_RUN="1")
    env.pop("LOOKUPD", None)
    proc = subprocess.run(
        ["dash", str(TOPICS_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("orderedmulti=true\n"), proc.stdout


# -- compose: the environment variables -----------------------------------------------------------

VARIABLES = {
    "FORK_ARCHIVE",
    "TOPICS",
    "TOPICS_TIMEOUT",
    "NSQ_BROADCAST_ADDRESS",
    "NSQ_BROADCAST_INTERFACE",
    "NSQ_PUBLISH_ADDRESS",
}
SERVERS = ("nsqlookupd", *NSQDS)


def test_every_variable_is_known_and_documented() -> None:
    found = (m.group("braced") or m.group("named") for m in _VARIABLE.finditer(COMPOSE.read_text()))
    used = {name for name in found if name}
    assert used == VARIABLES, f"compose.yaml uses {sorted(used)}"
    readme = (DOCKER / "README.md").read_text()
    for name in VARIABLES:
        assert f"`{name}" in readme, f"docker/README.md does not explain {name}"


def test_interpolate_follows_the_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    cases = {
        "${SET:-d}": "x",
        "${EMPTY:-d}": "d",
        "${EMPTY-d}": "",
        "${UNSET-d}": "d",
        "${UNSET:-}": "",
        "${SET:+a}": "a",
        "${EMPTY:+a}": "",
        "${EMPTY+a}": "a",
        "$SET/$$SET": "x/$SET",
    }
    for text, want in cases.items():
        assert interpolate(text, env) == want, text
    with pytest.raises(ValueError, match="needed"):
        interpolate("${UNSET:?needed}", env)


def test_broadcast_defaults_to_the_loopback_and_no_interface(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in SERVERS:
        assert flag(services[name], "broadcast-address") == "127.0.0.1", name
        # explicitly empty: nsqd's own default is eth0, which the fork prefers to the address
        assert flag(services[name], "broadcast-interface") == "", name
    assert {ip for svc in services.values() for ip, _, _ in published(svc)} == {"127.0.0.1"}


def test_broadcast_address_for_clients_in_other_containers() -> None:
    """``NSQ_BROADCAST_ADDRESS=nsq``: every server broadcasts the namespace's network alias."""
    env = {"NSQ_BROADCAST_ADDRESS": "nsq", "NSQ_PUBLISH_ADDRESS": "0.0.0.0"}  # noqa: S104
    services = load_compose(env)["services"]
    for name in SERVERS:
        assert flag(services[name], "broadcast-address") == "nsq", name
        assert namespace_owner(services, name) == "etcd", name
    networks = services["etcd"].get("networks") or {}
    assert "nsq" in (networks.get("default") or {}).get("aliases", []), (
        "the namespace's owner must carry the alias the servers broadcast"
    )
    # lookupd's node address is the host of --tcp-address unless that is empty; an explicit
    # 127.0.0.1 there would hand other containers a loopback address for the lookupd leader
    host = (flag(services["nsqlookupd"], "tcp-address") or "").rsplit(":", 1)[0]
    assert host == "", f"nsqlookupd --tcp-address names a host ({host!r})"
    assert {ip for svc in services.values() for ip, _, _ in published(svc)} == {"0.0.0.0"}  # noqa: S104


def test_broadcast_interface_overrides_for_every_server() -> None:
    services = load_compose({"NSQ_BROADCAST_INTERFACE": "eth0"})["services"]
    for name in SERVERS:
        assert flag(services[name], "broadcast-interface") == "eth0", name


def test_nsqadmin_is_opt_in_and_reads_the_cluster_lookupd(
    services: dict[str, dict[str, Any]],
) -> None:
    admin = services["nsqadmin"]
    assert admin.get("profiles") == ["admin"], "nsqadmin needs the full source: opt-in only"
    assert admin["build"]["target"] == "nsqadmin"
    assert command(admin)[:1] == ["nsqadmin"]
    assert namespace_owner(services, "nsqadmin") == "etcd"
    lookupd_port = port_of(flag(services["nsqlookupd"], "http-address") or "")
    assert flag(admin, "lookupd-http-address") == f"127.0.0.1:{lookupd_port}"
    port = port_of(flag(admin, "http-address") or "")
    assert (port, port) in {(h, c) for _, h, c in published(services["etcd"])}
    assert depends(admin).get("nsqlookupd") == "service_healthy"
    assert str(port) in " ".join(admin["healthcheck"]["test"])


def test_dockerfile_builds_nsqadmin_from_the_same_source() -> None:
    assert dockerfile_args().get("FORK_OPTIONAL_PROGRAMS") == "apps/nsqadmin"
    stages = [ln.split()[-1] for ln in code_lines(DOCKERFILE) if ln.startswith("FROM ")]
    assert "nsqadmin" in stages
    assert stages[-1] == "nsq", "the default target stays the servers' image"
    assert "COPY --from=build /out/nsqadmin /usr/local/bin/" in DOCKERFILE.read_text()
    assert "FORK_OPTIONAL_PROGRAMS" in BUILD_SCRIPT.read_text()
