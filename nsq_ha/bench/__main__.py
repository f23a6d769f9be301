"""``python -m nsq_ha.bench`` is ``nsq-ha bench``."""

import sys

from nsq_ha.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
