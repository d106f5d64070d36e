"""``python -m listener_router`` is the ``chalk`` command."""

import sys

from listener_router.cli import main

sys.exit(main())
