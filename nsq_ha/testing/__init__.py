"""Test support: build the real NSQ servers and run real clusters (with a pytest plugin).

* :mod:`nsq_ha.testing.build`: builds vanilla NSQ and the fork from the Go module proxy.
* :mod:`nsq_ha.testing.servers`: :class:`VanillaCluster`, :class:`ForkCluster`.
* :mod:`nsq_ha.testing.plugin`: pytest fixtures ``vanilla_cluster`` and ``fork_cluster``.
"""
