"""What importing the client costs: a client given ``nsqd=`` addresses loads no HTTP stack."""

from __future__ import annotations

import subprocess
import sys


def test_the_tcp_clients_import_without_httpx() -> None:
    # httpx (and whatever its package imports, rich's console when rich is installed) costs
    # about 10 MiB of RSS and 0.1 s of start-up; only nsqlookupd and admin requests need it
    code = (
        "import sys, nsq_ha, nsq_ha.consumer, nsq_ha.producer, nsq_ha.sync\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'httpcore')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
