"""Which of the sink's routing columns a write uses: the options ``topicColumn``,
``partitionColumn`` and ``headersColumn`` against the DataFrame's columns (see
:func:`nsq_ha.spark.options.parse_write_options`, the one caller, which turns the
:class:`~nsq_ha.errors.ConfigError` raised here into an ``OptionError``). Nothing here imports
the rest of :mod:`nsq_ha.spark`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from ..errors import ConfigError

__all__ = ["ROUTING_COLUMNS", "routing_columns"]

#: the sink's routing columns: lower-cased option key -> default column name
ROUTING_COLUMNS = {
    "topiccolumn": "topic",
    "partitioncolumn": "partition",
    "headerscolumn": "headers",
}


def routing_columns(
    values: Mapping[str, str],
    spell: Callable[[str], str],
    columns: Collection[str] | None,
    *,
    taken: Collection[str],
    topic_given: bool,
) -> dict[str, str | None]:
    """The column each of :data:`ROUTING_COLUMNS` uses (``None``: not used).

    ``values``: the options by lower-cased key; ``spell``: an option's name as the user wrote
    it; ``columns``: the DataFrame's (``None``: unknown, only explicit names are used);
    ``taken``: the body, key and trace columns; ``topic_given``: the option ``topic`` is set
    (it wins over the topic column). ``''`` or ``none`` ignores a column; a default name that
    is missing or taken is not used; an explicit one is refused."""
    found: dict[str, str | None] = {}
    for low, default in ROUTING_COLUMNS.items():
        explicit = low in values
        name = values[low].strip() if explicit else default
        used: str | None = name
        if not name or name.lower() == "none" or (low == "topiccolumn" and topic_given):
            used = None  # ignored (or the option 'topic' wins over the topic column)
        elif name in taken:
            if explicit:
                raise ConfigError(
                    f"option {spell(low)!r}: {name!r} is already the body/key/trace column"
                )
            used = None
        elif columns is None:
            used = name if explicit else None
        elif name not in columns:
            if explicit:
                raise ConfigError(
                    f"option {spell(low)!r}: the DataFrame has no column {name!r} (columns: "
                    f"{', '.join(sorted(columns))}); '' or none ignores such a column"
                )
            used = None
        found[low] = used
    in_use = [c for c in found.values() if c is not None]
    if len(set(in_use)) != len(in_use):
        raise ConfigError(
            "options 'topicColumn', 'partitionColumn' and 'headersColumn' must differ"
        )
    if not topic_given and found["topiccolumn"] is None:
        where = "" if columns is None else f" (columns: {', '.join(sorted(columns))})"
        raise ConfigError(
            "option 'topic' is required, or a column naming each row's topic: 'topic', or the "
            f"one option 'topicColumn' names{where}"
        )
    return found
