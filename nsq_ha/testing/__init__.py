"""Test support: build the real NSQ servers and run real clusters (with a pytest plugin).

* :mod:`nsq_ha.testing.build`: builds vanilla NSQ and the fork into a cache (the recipes in
  :mod:`~nsq_ha.testing.recipes`, where the source comes from in
  :mod:`~nsq_ha.testing.sources`, the Go build in :mod:`~nsq_ha.testing.gobuild`).
* :mod:`nsq_ha.testing.servers`: :class:`VanillaCluster`, :class:`ForkCluster`.
* :mod:`nsq_ha.testing.plugin`: pytest fixtures ``vanilla_cluster`` and ``fork_cluster``, and
  ``devcluster`` (the embedded broker, :mod:`nsq_ha.devcluster`: the ``devcluster`` extra,
  imported only when a test asks for the fixture).

Nothing here is imported by the client (``nsq_ha.producer``, ``nsq_ha.consumer``, ...).
"""
