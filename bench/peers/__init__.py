"""The peers Naiad is compared with: MLServer and KServe serving the same ONNX files.

Each runs in its own virtual environment (``make bench-setup``: ``.bench/venvs/mlserver``,
``.bench/venvs/kserve``), because their dependencies conflict with Naiad's. The modules here
are loaded by *those* interpreters, never by Naiad's.
"""
