"""The gateway's side of the queue: :class:`QueueDispatcher`, a remote model that looks local.

The protocol lives in :mod:`naiad.queue_client`, shared with workers (BLS calls from Python
models go through the same code); this module keeps the gateway's import path.
"""

from naiad.queue_client import BOUNDED_XADD, READER_BLOCK_S, WITHDRAW_TIMEOUT_S, QueueDispatcher

__all__ = ["BOUNDED_XADD", "READER_BLOCK_S", "WITHDRAW_TIMEOUT_S", "QueueDispatcher"]
