"""Worker processes (one model each), their backends and dynamic batcher, and the local scaler.

Importing this package imports no ML framework; each backend module imports its own lazily.
"""
