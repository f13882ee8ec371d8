"""``python -m batchsim``: the same as the ``batchsim`` command."""

import sys

from batchsim.cli import console_main

sys.exit(console_main())
