"""What a server build produces: the recipes of the real NSQ servers, as data.

Two recipes are known:

* :data:`VANILLA`: ``github.com/nsqio/nsq`` v1.3.0: ``nsqd``, ``nsqlookupd`` and the Go
  reference benchmark tools ``bench_writer`` / ``bench_reader``.
* :data:`FORK`: ``github.com/youzan/nsq`` (the partitioned "HA" fork): ``nsqd`` and
  ``nsqlookupd``, from a pinned revision (:class:`PinnedArchive`) with one source patch.

A recipe's :meth:`ServerRecipe.key` hashes everything that shapes the build, so the cache folder
(:meth:`ServerRecipe.dirname`) changes with any of it.  Where the source comes from is
:mod:`nsq_ha.testing.sources`; how it is built is :mod:`nsq_ha.testing.gobuild`; the cache is
:mod:`nsq_ha.testing.build`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

__all__ = [
    "FORK",
    "RECIPES",
    "VANILLA",
    "BuildError",
    "PinnedArchive",
    "ServerRecipe",
    "SourcePatch",
]


class BuildError(RuntimeError):
    """A server could not be built (or prebuilt binaries did not check out)."""


@dataclass(frozen=True, slots=True)
class SourcePatch:
    """Replace ``old`` by ``new`` (exactly once) in ``path`` of the module source."""

    path: str
    old: str
    new: str
    why: str


@dataclass(frozen=True, slots=True)
class PinnedArchive:
    """A source archive of the pinned revision, looked for in ``../shared/servers/``."""

    filename: str
    sha256: str
    #: the git commit the archive holds (docker/ clones it when no archive is given)
    commit: str = ""


@dataclass(frozen=True, slots=True)
class ServerRecipe:
    """Everything that decides what a server build produces."""

    name: str
    module: str
    version: str
    #: binary name -> package path inside the module
    programs: dict[str, str]
    #: the string ``<binary> --version`` must print for the main daemons
    expected_version: str
    extra_requires: tuple[tuple[str, str], ...] = ()
    patches: tuple[SourcePatch, ...] = ()
    ldflags: str = ""
    #: Go version written in the throwaway module (the machine's toolchain is used, >= this)
    go_directive: str = "1.22"
    #: the pinned revision's source archive, when the module proxy cannot be relied on
    archive: PinnedArchive | None = field(default=None, compare=False)

    def key(self, source_digest: str = "") -> str:
        """A short hash of the recipe and the source: the cache directory changes with either.

        ``source_digest`` is the sha256 of a local source ("" for the module proxy, whose
        content the version pins).  Where the pinned archive lives is not part of the key.
        """
        recipe = asdict(self)
        recipe.pop("archive")
        blob = json.dumps({"recipe": recipe, "source": source_digest}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def dirname(self, source_digest: str = "") -> str:
        """The cache folder of this recipe built from the source with that digest."""
        return f"{self.name}-{self.version}-{self.key(source_digest)}"

    @property
    def env_prefix(self) -> str:
        """``NSQ_HA_<NAME>``: the prefix of this recipe's ``_BIN_DIR`` / ``_SOURCE`` variables."""
        return f"NSQ_HA_{self.name.upper()}"


VANILLA = ServerRecipe(
    name="vanilla",
    module="github.com/nsqio/nsq",
    version="v1.3.0",
    programs={
        "nsqd": "apps/nsqd",
        "nsqlookupd": "apps/nsqlookupd",
        "bench_writer": "bench/bench_writer",
        "bench_reader": "bench/bench_reader",
    },
    expected_version="v1.3.0",
)

# The fork is pinned to master at b16e68eb (2024-04-11), which reports 0.3.7-HA.1.13.0, rather
# than the newest tag v0.3.7-HA.1.12.7: PROTOCOL.md and every golden recording in this project
# were verified against that exact revision, so tests and reference agree byte for byte.
FORK = ServerRecipe(
    name="fork",
    module="github.com/youzan/nsq",
    version="v0.3.7-HA.1.12.7.0.20240411024313-b16e68ebed1d",
    programs={"nsqd": "apps/nsqd", "nsqlookupd": "apps/nsqlookupd"},
    expected_version="0.3.7-HA.1.13.0",
    # reflect2 < 1.0.2 (required by the fork through json-iterator) crashes at start-up on
    # Go >= 1.18; the minimum-version selection picks this one instead.
    extra_requires=(("github.com/modern-go/reflect2", "v1.0.2"),),
    patches=(
        SourcePatch(
            path="nsqdserver/nsqd_server.go",
            old="reservedFDNum = 50000",
            new="reservedFDNum = 5000",
            why=(
                "nsqd refuses to start unless the soft RLIMIT_NOFILE is >= 2*reservedFDNum "
                "(100000); test machines often have a hard limit of 20000, so the local build "
                "lowers the reserve to 5000 (needs 10000 open files)"
            ),
        ),
    ),
    # Go >= 1.23 refuses old //go:linkname pulls of runtime internals used by old dependencies.
    ldflags="-checklinkname=0",
    # The module proxy refuses github.com/youzan/nsq (403), so the project keeps the pinned
    # revision's source, unmodified, in ../shared/servers/ (its README gives this sha256).
    archive=PinnedArchive(
        filename="youzan-nsq-b16e68eb.tar.gz",
        sha256="bc0fa7daee260c382df00e50317c9cd64e256fe064024cf74976231e43e46451",
        commit="b16e68ebed1d63251b09c1390524ad95f4ca6459",
    ),
)

RECIPES: dict[str, ServerRecipe] = {r.name: r for r in (VANILLA, FORK)}
