"""``python -m naiad_cli ...``: the ``naiad`` console script (how the scaler starts workers)."""

import sys

from naiad_cli.commands import main

sys.exit(main())
