"""The names of the ``nsq`` data source's options, and what to say about a name that is not one.

Spark hands a data source its option keys lower-cased, so names are compared in lower case and
shown in their documented camelCase spelling. An unknown name gets, in this order: the option
Kafka's source or sink calls by that name pointed at ours (``subscribe`` -> ``topics``; any
other ``kafka.*`` client setting has none), the other direction's option (``keyColumn`` on a
read is for writing), the closest known name (``topc`` -> ``topic``), or else the list of
known names. Pure: no pyspark, no I/O.
"""

from __future__ import annotations

import difflib
from typing import Literal

__all__ = ["KNOWN", "OptionKind", "spell", "unknown_option"]

#: whose options: a read's (the source) or a write's (the sink)
OptionKind = Literal["read", "write"]

#: how connections to nsqd are secured and compressed (source and sink alike)
_SECURITY_KEYS = {
    "tls",
    "tlscafile",
    "tlscertfile",
    "tlskeyfile",
    "tlsserverhostname",
    "authsecret",
    "authsecretfile",
    "allowplaintextauth",
    "compression",
    "deflatelevel",
}
_WRITE_KEYS = _SECURITY_KEYS | {
    "lookupd",
    "nsqd",
    "topic",
    "strategy",
    "bodycolumn",
    "keycolumn",
    "tracecolumn",
    "extcolumns",
    "trace",
    "maxbatch",
    "maxpending",
    "publishtimeout",
    "stampbatch",
    "topiccolumn",
    "partitioncolumn",
    "headerscolumn",
}
_READ_KEYS = _SECURITY_KEYS | {
    "lookupd",
    "nsqd",
    "topic",
    "topics",
    "topicpattern",
    "assign",
    "mode",
    "channel",
    "startingoffsets",
    "startingtimestamp",
    "endingoffsets",
    "endingtimestamp",
    "maxbytespertrigger",
    "maxmessagespertrigger",
    "failondataloss",
    "readtimeout",
    "walpath",
    "msgtimeout",
    "polltimeout",
    "stalechanneltimeout",
    "keyheader",
    "keybodyfield",
}
#: options Spark itself adds (``load(path)``, ``save(path)``) or that users commonly pass
#: along to every source and sink; accepted and not used
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})

#: the lower-cased option names of each kind (Spark's own aside)
KNOWN: dict[OptionKind, frozenset[str]] = {
    "read": frozenset(_READ_KEYS),
    "write": frozenset(_WRITE_KEYS),
}
_ALL = KNOWN["read"] | KNOWN["write"]

#: the documented camelCase spelling of each option key that has capitals, by its lower case
_CAMEL = {
    name.lower(): name
    for name in (  # noqa: SIM905 - one name a line would be 34 lines
        "tlsCaFile tlsCertFile tlsKeyFile tlsServerHostname authSecret authSecretFile "
        "allowPlaintextAuth deflateLevel bodyColumn keyColumn traceColumn extColumns maxBatch "
        "maxPending publishTimeout stampBatch topicColumn partitionColumn headersColumn "
        "startingOffsets startingTimestamp endingOffsets endingTimestamp maxBytesPerTrigger "
        "maxMessagesPerTrigger failOnDataLoss readTimeout walPath msgTimeout pollTimeout "
        "staleChannelTimeout keyHeader keyBodyField topicPattern"
    ).split()
}

_NONE = "nsq has no counterpart"
_ONE_TASK_PER_PARTITION = f"{_NONE}: a read has one Spark task per NSQ partition"
#: options of Kafka's source that ours do not share, by Kafka's spelling: what to use instead
#: (a name Kafka and we share, such as ``startingOffsets``, is not here)
_KAFKA_SOURCE = {
    "subscribe": "use 'topics' (comma separated) or 'topic'",
    "subscribePattern": "use 'topicPattern' (a Python regular expression, matched whole)",
    "startingOffsetsByTimestamp": "use 'startingTimestamp' (ms, for every partition)",
    "endingOffsetsByTimestamp": "use 'endingTimestamp' (ms, for every partition)",
    "startingOffsetsByTimestampStrategy": f"{_NONE}; see 'startingTimestamp'",
    "maxOffsetsPerTrigger": "use 'maxBytesPerTrigger', which counts bytes, not messages "
    "('maxMessagesPerTrigger' counts messages in mode=driver)",
    "minOffsetsPerTrigger": f"{_NONE}: a micro-batch reads what is there, up to "
    "'maxBytesPerTrigger'",
    "maxTriggerDelay": f"{_NONE}: a micro-batch reads what is there",
    "minPartitions": _ONE_TASK_PER_PARTITION,
    "maxRecordsPerPartition": _ONE_TASK_PER_PARTITION,
    "groupIdPrefix": "use 'channel' (NSQ keeps a read position per channel)",
    "kafka.group.id": "use 'channel' (NSQ keeps a read position per channel)",
    "kafkaConsumer.pollTimeoutMs": "use 'readTimeout' (seconds)",
    "fetchOffset.numRetries": f"{_NONE}: offsets are asked of nsqd within 'readTimeout'",
    "fetchOffset.retryIntervalMs": f"{_NONE}: offsets are asked of nsqd within 'readTimeout'",
}
#: options of Kafka's sink that ours do not share
_KAFKA_SINK = {
    "kafka.batch.size": "use 'maxBatch' (rows per publish)",
    "kafka.max.in.flight.requests.per.connection": "use 'maxPending' (rows in flight per task)",
    "kafka.delivery.timeout.ms": "use 'publishTimeout' (seconds)",
}
#: options of both
_KAFKA_BOTH = {
    "includeHeaders": "nsq's rows always have 'headers' and 'ext'; a sink writes a 'headers' "
    "column when the DataFrame has one (see 'headersColumn')",
    "kafka.bootstrap.servers": "use 'lookupd' (nsqlookupd HTTP addresses such as "
    "http://host:4161, comma separated) or 'nsqd' (nsqd TCP host:port, for vanilla nsqd)",
    "kafka.security.protocol": "use 'tls' (true or false), and 'authSecret' or "
    "'authSecretFile' for nsqd's AUTH",
    "kafka.ssl.truststore.location": "use 'tlsCaFile' (PEM)",
    "kafka.ssl.keystore.location": "use 'tlsCertFile' and 'tlsKeyFile' (PEM)",
    "kafka.sasl.jaas.config": "use 'authSecret' or 'authSecretFile' (nsqd's AUTH secret)",
    "kafka.compression.type": "use 'compression' (none, snappy or deflate)",
}
#: lower-cased Kafka name -> (its spelling, the kinds it applies to, what to use instead)
_KAFKA = {
    name.lower(): (name, kinds, advice)
    for table, kinds in (
        (_KAFKA_SOURCE, ("read",)),
        (_KAFKA_SINK, ("write",)),
        (_KAFKA_BOTH, ("read", "write")),
    )
    for name, advice in table.items()
}
_WHO = {"read": "source", "write": "sink"}
_USES = {"read": "consumer", "write": "producer"}
_OTHER: dict[OptionKind, OptionKind] = {"read": "write", "write": "read"}
_FOR = {
    "read": "reading (spark.read, spark.readStream)",
    "write": "writing (df.write, df.writeStream)",
}


def spell(low: str) -> str:
    """The documented camelCase spelling of a lower-cased option key."""
    return _CAMEL.get(low, low)


def unknown_option(key: str, kind: OptionKind, what: str) -> str | None:
    """Why ``key`` is not an option of ``what`` (a read or a write), saying what to use
    instead; ``None`` when it is one (or one of Spark's own)."""
    low = key.lower()
    known = KNOWN[kind]
    if low in known or low in SPARK_KEYS:
        return None
    everything = sorted(spell(k) for k in known)
    listed = f"known options: {', '.join(everything)}"
    if low in _KAFKA:
        name, kinds, advice = _KAFKA[low]
        if kind in kinds:
            return f"{name!r} is Kafka's option: {advice} ({what})"
        return f"{name!r} is an option of Kafka's {_WHO[_OTHER[kind]]}, not for {what}; {listed}"
    if low.startswith("kafka"):
        return (
            f"{key!r}: nsq has no Kafka {_USES[kind]} settings; see the option list of the "
            f"nsq {_WHO[kind]} ({what}): {listed}"
        )
    if low in _ALL:
        return f"option {spell(low)!r} is for {_FOR[_OTHER[kind]]}, not for {what}"
    close = difflib.get_close_matches(low, sorted(known), n=1)
    if close:
        return f"unknown option {key!r} for {what}: did you mean {spell(close[0])!r}?"
    return f"unknown option {key!r} for {what}; {listed}"
