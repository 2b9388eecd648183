"""A model file that calls sys.exit() while it is imported (issue 17, finding 5)."""

import sys

sys.exit(3)
