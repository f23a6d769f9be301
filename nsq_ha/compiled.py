"""Whether the hot modules run compiled (mypyc) or as pure Python, and why.

``python -m nsq_ha.compiled`` prints one line: ``compiled: mypyc build for
cpython-312-x86_64-linux-gnu (13 modules)`` or ``pure Python: <the reason and what to do>``.
``active()`` answers as a bool. The optional build and how it is chosen: ``make compiled``,
``NSQ_HA_PURE=1``, and ``nsq_ha._compiled_finder``'s docstring.
"""

from __future__ import annotations

import sys

from nsq_ha._compiled_finder import MODULES, PURE_ENV, active, is_compiled, status

__all__ = ["MODULES", "PURE_ENV", "active", "is_compiled", "status"]

if __name__ == "__main__":
    sys.stdout.write(status() + "\n")
