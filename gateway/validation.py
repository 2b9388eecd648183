"""Check an inference request against its model's configuration before it is queued.

The rules live in :mod:`naiad.validation`, shared with workers (BLS requests from Python
models); this module keeps the gateway's import path.
"""

from naiad.validation import client_shape, validate_request, wire_datatype

__all__ = ["client_shape", "validate_request", "wire_datatype"]
