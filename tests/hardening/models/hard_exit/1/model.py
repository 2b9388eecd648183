"""A model file whose import ends the process at once, as a crash in a native import
would: nothing in Python gets to report it (issue 17, finding 5)."""

import os

os._exit(7)
