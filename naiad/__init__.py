"""Naiad: a serverless, scale-to-zero inference gateway for the KServe v2 / Triton protocol.

This package holds what the gateway and the workers share: the error hierarchy, the datatype
table, the Redis key names, the queue wire codec, the embedded Redis launcher and the CLI.
It never imports a web framework or an ML framework.
"""

__version__ = "0.1.0"
