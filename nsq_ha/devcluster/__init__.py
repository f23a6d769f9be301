"""The embedded broker (work in progress, issue 6): so far the partition store.

:mod:`nsq_ha.devcluster.store` holds one topic partition's log and channels as the fork's nsqd
does (ids, offsets, raw sizes, in-flight, ordered channels, seek). The TCP and HTTP servers and
``DevCluster`` come next.
"""
