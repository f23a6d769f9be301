"""The ``nsq`` source: the reader side of the data source.

Two kinds of source (see :mod:`nsq_ha.spark`):

**Replayable** (the fork in cluster mode). An offset is the byte position in each partition's
queue of each topic, ``{"channel": C, "topics": {"a": {"0": 1234, ...}, ...}}`` (see
:mod:`.topics`, which also reads the single-topic form of older checkpoints); the channel is
the query's own, so its cursor is nobody else's. A Spark task reads ``[start, end)`` of one
partition: it creates the channel on the partition's leader, moves it to ``start`` with
``POST /channel/setoffset virtual_queue:<start>``, subscribes ordered (every message then
carries its offset and raw size), keeps the messages whose offset is in the range, and stops at
the first one that ends at or past ``end``. Reading the same range again gives the same rows
while the data is retained.

**Driver** (vanilla NSQ, or ``mode=driver``). One consumer per topic on the driver (the same
channel name on each) pulls up to ``maxMessagesPerTrigger`` messages per micro-batch in all,
writes them to a write-ahead file under ``walPath`` (a local path or a URI of HDFS or an
object store, see :mod:`.wal`) before handing them to Spark (a replayed batch is read from
there, identical), keeps them in flight (touching them) and finishes them only when Spark
commits the batch. If the driver dies, nsqd redelivers what was not finished: at-least-once.

The modules: :mod:`.readers` (Spark's replayable stream and batch reader) and :mod:`.driver`
(the driver source's Spark classes) over :mod:`.extents` (what partitions retain, byte limits,
data loss), :mod:`.ranges` (an executor's read of one range), :mod:`.channels` (a range read's
channel, and the sweeper of those a killed task left), :mod:`.topics` (topic listing, offsets),
:mod:`.arrow` (rows as Arrow batches), :mod:`.driver_reader` (the driver source's state) and
:mod:`.wal` (its write-ahead log).
"""
