"""``python -m nsq_ha`` runs the ``nsq-ha`` command line."""

import sys

from nsq_ha.cli import main

sys.exit(main())
