"""Sharding key -> partition: pure functions, selectable per producer.

Per-key order on the fork only holds if every producer of a topic maps a key to the same
partition, and the fork's two reference SDKs do it differently (PROTOCOL.md §6.2).  So the
strategy is chosen per producer:

``murmur3`` (default)
    Identical to the fork's Go SDK configured with its usual hasher
    (``Config.Hasher = murmur3.New32()``): MurmurHash3 x86 32-bit, seed 0, over the key's bytes,
    as an unsigned 32-bit value modulo ``partition_num``.
``java``
    Identical to the fork's Java SDK: Java ``hashCode()`` of the key object, then
    ``abs(hash % partition_num)`` with Java's truncating remainder.
``jump``
    Jump consistent hash (Lamping & Veach) over a 64-bit MurmurHash3 of the key's bytes: when a
    topic grows from ``n`` to ``n + 1`` partitions only about ``1 / (n + 1)`` of the keys move,
    all of them to the new partition.  No reference SDK does this; use it only when every
    producer of the topic is nsq_ha.

How keys become bytes or hash codes, exactly:

=========  ======================================  =======================================
key type   ``murmur3`` / ``jump`` hash the bytes    ``java`` uses the hashCode of
=========  ======================================  =======================================
``str``    its UTF-8 encoding (a lone surrogate     ``java.lang.String`` (31-polynomial over
           has none: refused)                       UTF-16 code units, 32-bit wrap-around)
``bytes``  the bytes as given                       refused: a Java ``byte[]`` has no stable
                                                    hashCode, so no Java producer can match it
``int``    8 bytes, big-endian, two's complement    ``java.lang.Long``: low 32 bits of
           (Go's ``binary.BigEndian.PutUint64``);   ``v ^ (v >>> 32)`` (a Java ``Integer``
           range ``-2**63 .. 2**64 - 1``            key hashes differently when negative);
                                                    range ``-2**63 .. 2**63 - 1``
=========  ======================================  =======================================

``bool`` is refused everywhere (it is an ``int`` in Python but means something else).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import mmh3

from nsq_ha.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "ShardingKey",
    "ShardingStrategy",
    "get_strategy",
    "java_hash_code",
    "jump_hash",
    "key_bytes",
    "partition_for_key",
]

ShardingKey = str | bytes | int

_U32: Final = 0xFFFF_FFFF
_U64: Final = 0xFFFF_FFFF_FFFF_FFFF
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
#: The fork numbers partitions 0..254 (PROTOCOL.md §5.4: 255 is refused by the coordinator).
MAX_PARTITION_NUM: Final = 255


def _check_key(key: object) -> None:
    if isinstance(key, bool) or not isinstance(key, str | bytes | int):
        raise InvalidArgumentError(
            f"sharding key must be str, bytes or int, not {type(key).__name__}"
        )


def key_bytes(key: ShardingKey) -> bytes:
    """The bytes ``murmur3`` and ``jump`` hash: UTF-8, as given, or 8-byte big-endian."""
    _check_key(key)
    if isinstance(key, str):
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"str sharding key has a lone surrogate ({key[exc.start]!r} at index "
                f"{exc.start}), so it has no UTF-8 bytes to hash; pass valid text or bytes"
            ) from None
    if isinstance(key, bytes):
        return key
    if not _I64_MIN <= key <= _U64:
        raise InvalidArgumentError(f"int sharding key {key} does not fit in 64 bits")
    return (key & _U64).to_bytes(8, "big")


def java_hash_code(key: ShardingKey) -> int:
    """Java's ``hashCode()`` of the key as a ``String`` (str) or a ``Long`` (int), signed 32-bit."""
    _check_key(key)
    if isinstance(key, bytes):
        raise InvalidArgumentError(
            "the java strategy cannot hash bytes: a Java byte[] has no stable hashCode; "
            "use a str or int key (or the murmur3 strategy)"
        )
    if isinstance(key, str):
        units = key.encode("utf-16-be", "surrogatepass")
        h = 0
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & _U32
    else:
        if not _I64_MIN <= key <= _I64_MAX:
            raise InvalidArgumentError(f"int sharding key {key} does not fit in a Java long")
        v = key & _U64
        h = (v ^ (v >> 32)) & _U32
    return h - (1 << 32) if h & 0x8000_0000 else h


def jump_hash(key64: int, buckets: int) -> int:
    """Jump consistent hash of an unsigned 64-bit key into ``range(buckets)``."""
    if buckets < 1:
        raise InvalidArgumentError(f"bucket count must be >= 1, got {buckets}")
    b, j = -1, 0
    key = key64 & _U64
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _U64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


@dataclass(frozen=True, slots=True)
class ShardingStrategy:
    """A named key -> partition function."""

    name: str
    description: str
    _partition: Callable[[ShardingKey, int], int]

    def partition(self, key: ShardingKey, partition_num: int) -> int:
        """The partition (``0 <= p < partition_num``) that ``key`` belongs to."""
        if isinstance(partition_num, bool) or not isinstance(partition_num, int):
            raise InvalidArgumentError(f"partition_num must be an int, not {partition_num!r}")
        if not 1 <= partition_num <= MAX_PARTITION_NUM:
            raise InvalidArgumentError(
                f"partition_num must be 1..{MAX_PARTITION_NUM}, got {partition_num} "
                "(a topic without partitions cannot be routed to)"
            )
        return self._partition(key, partition_num)

    def __repr__(self) -> str:
        return f"<ShardingStrategy {self.name}>"


STRATEGIES: Final[dict[str, ShardingStrategy]] = {
    s.name: s
    for s in (
        ShardingStrategy(
            "murmur3",
            "fork Go SDK with murmur3.New32(): mmh3_32(bytes) mod n",
            lambda key, n: mmh3.hash(key_bytes(key), 0, signed=False) % n,
        ),
        # Java's truncating remainder keeps the hash's sign; abs() of it equals abs(hash) mod n
        ShardingStrategy(
            "java",
            "fork Java SDK: abs(hashCode() % n)",
            lambda key, n: abs(java_hash_code(key)) % n,
        ),
        ShardingStrategy(
            "jump",
            "jump consistent hash over mmh3_x64 (nsq_ha only)",
            lambda key, n: jump_hash(mmh3.hash64(key_bytes(key), 0, signed=False)[0], n),
        ),
    )
}

DEFAULT_STRATEGY: Final = STRATEGIES["murmur3"]


def get_strategy(name: str | ShardingStrategy) -> ShardingStrategy:
    """The strategy called ``name`` (``murmur3``, ``java``, ``jump``); strategies pass through."""
    strategy = name if isinstance(name, ShardingStrategy) else STRATEGIES.get(name)
    if strategy is None:
        raise InvalidArgumentError(
            f"unknown sharding strategy {name!r}; choose one of {', '.join(STRATEGIES)}"
        )
    return strategy


def partition_for_key(
    key: ShardingKey, partition_num: int, strategy: str | ShardingStrategy = DEFAULT_STRATEGY
) -> int:
    """Shortcut: ``get_strategy(strategy).partition(key, partition_num)``."""
    return get_strategy(strategy).partition(key, partition_num)
