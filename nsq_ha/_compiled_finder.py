"""The finder behind ``nsq_ha.compiled``: which path runs the hot modules, mypyc's or Python's.

``make compiled`` puts the mypyc build of ``MODULES`` and a manifest of their sources' hashes in
``nsq_ha/_compiled/<interpreter tag>/``, where the default import system never looks; the path
hook ``install()`` adds loads it unless ``NSQ_HA_PURE`` is set (not ``0``), or the manifest is
missing, lists other modules or another hash (a stale build runs as pure Python, saying so once
on stderr). ARCHITECTURE.md ("The compiled build") tells more. The ``nsq_ha_compiled.pth`` file
the build writes calls ``install()`` at interpreter start, loading this file by its path without
importing the package (pytest warns when its plugin's package is already imported); nothing in
the package imports it. It is apart from ``nsq_ha.compiled`` so that ``python -m
nsq_ha.compiled`` runs a module not yet imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import sysconfig
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

# Light on purpose (the .pth file loads it at every interpreter start): hashlib and json load at
# the first import of a hot module, typing's NamedTuple and dataclasses never.

# The hot path of a message: the sans-IO protocol, the transport, the connection's core and
# reader, and the consumer's per-message modules (message, hand-out, RDY planner, slots).
# Left out, each for a reason a compiled module would change what callers see (mypyc checks
# annotated types at run time and its classes are native): consumer/core.py (the Consumer's bad
# arguments would raise TypeError instead of ConfigError, its instances take no weak reference,
# which the OpenTelemetry metrics need, its signature reads (*args), and OpenTelemetry replaces
# its methods) and protocol/commands.py. consumer/message.py is in since OpenTelemetry answers
# through its hook (set_answer_hook) instead of replacing Message's methods, and a requeue delay
# is checked by the message (typed object), not by mypyc; consumer/rdy.py since its callers
# pass checked values only (ConsumerConfig, Consumer.set_max_in_flight); slots, handout
# and the reader since their unit tests build real connections, slots and transports.
MODULES: tuple[str, ...] = (
    "nsq_ha.protocol.error_frames",
    "nsq_ha.protocol.events",
    "nsq_ha.protocol.frames",
    "nsq_ha.protocol.message",
    "nsq_ha.protocol.session",
    "nsq_ha.transport",
    "nsq_ha.connection.core",
    "nsq_ha.consumer.message",
    "nsq_ha.consumer.handout",
    "nsq_ha.consumer.rdy",
    "nsq_ha.consumer.slots",
    "nsq_ha.connection.reader",
    # the producer's publish path, from the call's queue to nsqd's answer; not producer/core.py
    # (Producer: the OpenTelemetry instrumentation wraps its methods and its sweeper holds a
    # weak reference to it) nor producer/config.py (read once per producer)
    "nsq_ha.protocol.publish",
    "nsq_ha.producer.batch",
    "nsq_ha.producer.limits",
    "nsq_ha.producer.message",
    "nsq_ha.producer.pool",
    "nsq_ha.producer.routes",
    "nsq_ha.producer.sender",
    "nsq_ha.producer.topic",
    # the blocking consumer's per-message hand-out and answers (nsq_ha.sync stays Python)
    "nsq_ha._sync_handout",
)
# mypyc's shared library for the group: every module's extension imports it by this name
GROUP = "nsq_ha._hot"
LIBRARY = f"{GROUP}__mypyc"
PURE_ENV = "NSQ_HA_PURE"
PTH_NAME = "nsq_ha_compiled.pth"
MANIFEST = "manifest.json"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
EXT_SUFFIX: str = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def interpreter_tag() -> str:
    """This interpreter's extension tag, e.g. ``cpython-311-x86_64-linux-gnu``."""
    return EXT_SUFFIX.removeprefix(".").removesuffix(".so").removesuffix(".pyd") or "unknown"


def artifact_dir() -> str:
    """Where the compiled build for this interpreter lives (git-ignored)."""
    return os.path.join(PACKAGE_DIR, "_compiled", interpreter_tag())


def built_file(module: str) -> str:
    """A module's extension file under the artifact directory, in the package's layout, mypyc's
    library at the top (mypyc sets a module's ``__file__`` to the library's folder + its path)."""
    if module == LIBRARY:
        return module.rpartition(".")[2] + EXT_SUFFIX
    return os.path.join(*module.split(".")) + EXT_SUFFIX


def source_path(module: str) -> str:
    """The ``.py`` file of one of ``MODULES``."""
    parts = module.split(".")
    if parts[0] != "nsq_ha" or len(parts) < 2:
        raise ValueError(f"{module!r} is not a module of nsq_ha")
    return os.path.join(PACKAGE_DIR, *parts[1:-1], parts[-1] + ".py")


def source_hash(module: str) -> str | None:
    """The sha256 of a module's source, as the manifest records it (None: no source)."""
    import hashlib

    try:
        with open(source_path(module), "rb") as file:
            return hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None


class Decision:
    """The path chosen for this process and the reason, in words a developer can act on."""

    __slots__ = ("compiled", "reason", "stale")

    def __init__(self, compiled: bool, reason: str, stale: tuple[str, ...] = ()) -> None:
        self.compiled = compiled
        self.reason = reason
        self.stale = stale

    def __repr__(self) -> str:
        return f"Decision(compiled={self.compiled}, reason={self.reason!r})"


def decide(modules: Sequence[str] = MODULES, directory: str | None = None) -> Decision:
    """Choose the path from the environment and the manifest in ``directory`` (default: ours)."""
    import json

    if os.environ.get(PURE_ENV, "") not in ("", "0"):  # any value but empty or 0
        return Decision(False, f"{PURE_ENV} is set")
    manifest = os.path.join(directory or artifact_dir(), MANIFEST)
    try:
        with open(manifest, encoding="utf-8") as file:
            recorded = json.load(file)["modules"]
    except FileNotFoundError:
        return Decision(False, f"no compiled build for {interpreter_tag()}: run `make compiled`")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Decision(False, f"unreadable {manifest}: {exc}; run `make compiled`")
    if not isinstance(recorded, dict) or sorted(recorded) != sorted(modules):
        return Decision(False, "the compiled build has another module set: run `make compiled`")
    stale = tuple(m for m in modules if source_hash(m) != recorded[m])
    if stale:
        root = os.path.dirname(PACKAGE_DIR)
        names = ", ".join(os.path.relpath(source_path(m), root) for m in stale)
        fix = f"run `make compiled` (or set {PURE_ENV}=1)"
        return Decision(False, f"the compiled build is older than {names}: {fix}", stale)
    return Decision(True, f"mypyc build for {interpreter_tag()} ({len(modules)} modules)")


class CompiledFinder:
    """Loads ``MODULES`` and mypyc's group library from the build, once ``decide()`` allows.
    Decided at the first import of one of them, for the whole process: the modules of a mypyc
    group call each other directly, so the set is compiled as a whole or not at all."""

    def __init__(self, modules: Sequence[str] = MODULES, directory: str | None = None) -> None:
        self.modules = frozenset(modules)
        self.directory = directory or artifact_dir()
        self.decision: Decision | None = None

    def find_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        if fullname != LIBRARY and fullname not in self.modules:
            return None
        if self.decision is None:
            self.decision = decide(sorted(self.modules), self.directory)
            if self.decision.stale:
                sys.stderr.write(f"nsq_ha: pure Python: {self.decision.reason}\n")
        if not self.decision.compiled:
            return None
        file = os.path.join(self.directory, built_file(fullname))
        loader = importlib.machinery.ExtensionFileLoader(fullname, file)
        spec = importlib.machinery.ModuleSpec(fullname, loader, origin=file)
        spec.has_location = True
        return spec

    def __repr__(self) -> str:
        return f"CompiledFinder(modules={len(self.modules)}, decision={self.decision!r})"


class HotDirectory:
    """The path entry finder of a hot modules' directory: the build's extension module where
    ``CompiledFinder`` allows, else the directory's own files. Under ``PathFinder``, not on
    ``sys.meta_path``, so that pytest's assertion rewriting hook, which asks ``PathFinder``, sees
    the extension module too (it would load the ``.py`` itself)."""

    def __init__(self, path: str, compiled: CompiledFinder) -> None:
        self.path = path
        self.compiled = compiled
        self.files = importlib.machinery.FileFinder(
            path,
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
        )

    def find_spec(
        self, fullname: str, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return self.compiled.find_spec(fullname) or self.files.find_spec(fullname, target)

    def invalidate_caches(self) -> None:
        self.files.invalidate_caches()

    def __repr__(self) -> str:
        return f"HotDirectory({self.path!r}, {self.compiled!r})"


#: the finder ``install()`` added, if the environment enables the compiled build
_installed: CompiledFinder | None = None


def install() -> CompiledFinder:
    """Add the path hook of the hot modules' directories (once); the ``.pth`` file calls this."""
    global _installed
    if _installed is not None:
        return _installed
    finder = CompiledFinder()
    # the hot modules' directories, and the package's own (mypyc's library)
    directories = {PACKAGE_DIR} | {os.path.dirname(source_path(m)) for m in MODULES}

    def path_hook(path: str) -> HotDirectory:
        if os.path.abspath(path) not in directories:
            raise ImportError("not a directory of nsq_ha's hot modules")
        return HotDirectory(path, finder)

    sys.path_hooks.insert(0, path_hook)
    for path in list(sys.path_importer_cache):
        if os.path.abspath(path) in directories:
            del sys.path_importer_cache[path]
    _installed = finder
    return finder


def is_compiled(module: ModuleType) -> bool:
    """Whether a loaded module is an extension module (mypyc's) rather than its ``.py``."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def active() -> bool:
    """Whether the hot modules run compiled in this process (imports the first of them)."""
    return is_compiled(importlib.import_module(MODULES[0]))


def status() -> str:
    """One line: the live path and why."""
    finder = _installed
    if finder is None:
        return f"pure Python: no compiled build in this environment (no {PTH_NAME}; make compiled)"
    importlib.import_module(MODULES[0])
    decision = finder.decision or decide(sorted(finder.modules))
    loaded = [m for m in MODULES if m in sys.modules and is_compiled(sys.modules[m])]
    if decision.compiled and loaded:
        return f"compiled: {decision.reason}"
    return f"pure Python: {decision.reason}"
