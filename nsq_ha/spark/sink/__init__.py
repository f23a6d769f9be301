"""The ``nsq`` sink: the writer side of the data source.

:mod:`.writers` holds Spark's writers (``df.write``, ``df.writeStream``; Arrow batches where
PySpark offers them); :mod:`.publish` what one task does to publish its rows; :mod:`.arrow`
how it reads Arrow record batches (by column when the rows are only a body and a key);
:mod:`.columns` each row's topic, partition and headers, and the runs a chunk of rows is cut
into.
"""
