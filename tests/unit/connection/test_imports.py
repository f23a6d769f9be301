"""What a connection loads: the compression codecs (and python-snappy) when nsqd agrees to
compress, the file-based Security settings when asked for, and neither before."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import nsq_ha, nsq_ha.producer, nsq_ha.consumer, nsq_ha.sync
import nsq_ha.connection as connection
loaded = {name for name in ("nsq_ha.protocol.compression", "snappy", "nsq_ha.connection.security")
          if name in sys.modules}
assert not loaded, loaded
assert connection.Security.__module__ == "nsq_ha.connection.security"
from nsq_ha.connection import Compression, security
assert Compression is security.Compression
from nsq_ha.connection.handshake import codec_for
assert type(codec_for("deflate", 6)).__name__ == "DeflateCodec"
assert "nsq_ha.protocol.compression" in sys.modules
"""


def test_compression_and_security_load_only_when_used() -> None:
    command = [sys.executable, "-c", CHECK]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
