"""A model whose initialize fails: it never serves."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("weights file is missing")

    def execute(self, requests):
        raise AssertionError("never called")
