"""Sharding strategies: PROTOCOL.md §6.2 golden vectors and each strategy's properties."""

from __future__ import annotations

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError
from nsq_ha.routing import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    get_strategy,
    java_hash_code,
    jump_hash,
    key_bytes,
    partition_for_key,
)

NS = (2, 3, 4, 8, 16)

# key, mmh3 32-bit (seed 0), go pids for NS  (PROTOCOL.md §6.2, checked against the fork's go-nsq)
GO_VECTORS = [
    ("publish_test_case", 2993523516, (0, 0, 0, 4, 12)),
    ("order-12345", 1785094598, (0, 2, 2, 6, 6)),
    ("12345", 329585043, (1, 0, 3, 3, 3)),
    ("a", 1009084850, (0, 2, 2, 2, 2)),
    (bytes.fromhex("0000000000003039"), 3738418229, (1, 2, 1, 5, 5)),
]

# key, Java hashCode, java pids for NS  (computed on a real JVM)
JAVA_VECTORS = [
    ("publish_test_case", 937479053, (1, 2, 1, 5, 13)),
    ("order-12345", 478832884, (0, 1, 0, 4, 4)),
    ("12345", 46792755, (1, 0, 3, 3, 3)),
    (12345, 12345, (1, 0, 1, 1, 9)),
    (-7, 6, (0, 0, 2, 6, 6)),
    (123456789012345, -2045923535, (1, 2, 3, 7, 15)),
    ("中文", 646394, (0, 2, 2, 2, 10)),
]


@pytest.mark.parametrize(("key", "hash32", "pids"), GO_VECTORS)
def test_murmur3_matches_the_go_sdk(key: str | bytes, hash32: int, pids: tuple[int, ...]) -> None:
    assert mmh3.hash(key_bytes(key), 0, signed=False) == hash32
    assert tuple(partition_for_key(key, n, "murmur3") for n in NS) == pids
    assert tuple(DEFAULT_STRATEGY.partition(key, n) for n in NS) == pids


def test_int_keys_are_big_endian_u64_for_murmur3() -> None:
    assert key_bytes(12345) == bytes.fromhex("0000000000003039")
    assert tuple(partition_for_key(12345, n) for n in NS) == (1, 2, 1, 5, 5)
    assert key_bytes(-1) == b"\xff" * 8  # two's complement, as Go's uint64(int64(-1))
    assert key_bytes(2**64 - 1) == b"\xff" * 8


@pytest.mark.parametrize(("key", "hash_code", "pids"), JAVA_VECTORS)
def test_java_matches_the_java_sdk(key: str | int, hash_code: int, pids: tuple[int, ...]) -> None:
    assert java_hash_code(key) == hash_code
    assert tuple(partition_for_key(key, n, "java") for n in NS) == pids


def test_java_string_hash_uses_utf16_code_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in Java: 0xD83D * 31 + 0xDE00
    assert java_hash_code("\U0001f600") == 0xD83D * 31 + 0xDE00
    assert java_hash_code("") == 0
    # wrap-around to a negative int, as Java does
    assert java_hash_code("polygenelubricants") == -(2**31)


def test_java_long_hash_folds_the_high_word() -> None:
    assert java_hash_code(1 << 32) == 1
    assert java_hash_code(-(2**63)) == -(2**31)
    assert java_hash_code(2**63 - 1) == -(2**31)


@pytest.mark.parametrize("strategy", ["murmur3", "java", "jump"])
@given(key=st.one_of(st.text(), st.integers(-(2**63), 2**63 - 1)), n=st.integers(1, 255))
def test_every_strategy_lands_in_range_and_is_stable(strategy: str, key: str | int, n: int) -> None:
    p = partition_for_key(key, n, strategy)
    assert 0 <= p < n
    assert partition_for_key(key, n, strategy) == p


@given(key=st.integers(0, 2**64 - 1), n=st.integers(1, 300))
def test_jump_only_moves_keys_to_the_new_bucket(key: int, n: int) -> None:
    before, after = jump_hash(key, n), jump_hash(key, n + 1)
    assert after in (before, n)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 64])
def test_jump_moves_about_one_in_n_plus_one_keys(n: int) -> None:
    keys = [f"key-{i}" for i in range(20_000)]
    moved = sum(
        partition_for_key(k, n, "jump") != partition_for_key(k, n + 1, "jump") for k in keys
    )
    expected = len(keys) / (n + 1)
    assert abs(moved - expected) < 0.1 * expected + 50


@pytest.mark.parametrize("n", [2, 4, 16])
def test_jump_spreads_keys_evenly(n: int) -> None:
    counts = [0] * n
    for i in range(16_000):
        counts[partition_for_key(i, n, "jump")] += 1
    assert max(counts) - min(counts) < 0.15 * 16_000 / n


def test_murmur3_moves_most_keys_when_the_topic_grows() -> None:
    """Why ``jump`` exists: modulo hashing reshuffles about n/(n+1) of the keys."""
    keys = [f"key-{i}" for i in range(4_000)]
    moved = sum(partition_for_key(k, 4) != partition_for_key(k, 5) for k in keys)
    assert moved > 0.7 * len(keys)


@pytest.mark.parametrize("bad", [True, 1.5, None, ["a"], bytearray(b"x")])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_bad_key_types_are_refused(strategy: str, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="sharding key must be str, bytes or int"):
        partition_for_key(bad, 4, strategy)  # type: ignore[arg-type]


def test_out_of_range_ints_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="does not fit in 64 bits"):
        partition_for_key(2**64, 4)
    with pytest.raises(InvalidArgumentError, match="does not fit in a Java long"):
        partition_for_key(2**63, 4, "java")


def test_java_refuses_bytes_with_a_reason() -> None:
    with pytest.raises(InvalidArgumentError, match="byte\\[\\] has no stable hashCode"):
        partition_for_key(b"abc", 4, "java")


@pytest.mark.parametrize("n", [0, -1, 256, True, 2.0])
def test_partition_num_is_checked(n: object) -> None:
    with pytest.raises(InvalidArgumentError, match="partition_num"):
        partition_for_key("k", n)  # type: ignore[arg-type]


def test_jump_needs_a_bucket() -> None:
    with pytest.raises(InvalidArgumentError, match="bucket count"):
        jump_hash(1, 0)


def test_strategy_lookup() -> None:
    assert get_strategy("java") is STRATEGIES["java"]
    assert get_strategy(STRATEGIES["jump"]) is STRATEGIES["jump"]
    assert repr(STRATEGIES["murmur3"]) == "<ShardingStrategy murmur3>"
    with pytest.raises(InvalidArgumentError, match="unknown sharding strategy 'crc32'"):
        get_strategy("crc32")


@pytest.mark.parametrize("key", ["\ud800", "a\udfffb", "\udc80x"])
def test_a_lone_surrogate_key_is_an_invalid_argument_for_byte_hashing_strategies(
    key: str,
) -> None:
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        key_bytes(key)
    for name in ("murmur3", "jump"):
        with pytest.raises(InvalidArgumentError, match="lone surrogate"):
            get_strategy(name).partition(key, 4)
    # Java strings hold UTF-16 code units, lone surrogates included: the java strategy hashes it
    assert get_strategy("java").partition(key, 4) == abs(java_hash_code(key)) % 4
