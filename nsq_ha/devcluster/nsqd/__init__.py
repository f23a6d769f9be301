"""The emulated nsqd of one DevCluster node: its TCP server and its HTTP API.

:mod:`.server` (:class:`NsqdServer`, the listener) serves each client with a
:mod:`.connection` (the V2 protocol as the fork speaks it), which reads commands with
:mod:`.args`, :mod:`.identify` and :mod:`.publish` and writes frames with :mod:`.output`;
:mod:`.http` (:func:`make_nsqd_handler`) is the node's HTTP API, with :mod:`.stats` for
``/stats``.  They see the cluster through :mod:`..view` and its :mod:`..model`.
"""

from .http import make_nsqd_handler
from .server import NsqdServer

__all__ = ["NsqdServer", "make_nsqd_handler"]
