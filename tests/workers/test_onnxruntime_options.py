"""``workers.backends.onnxruntime.session_options``: Triton's thread-count parameters, and idle
intra-op threads that do not spin unless the model asks (docs/architecture.md)."""

from __future__ import annotations

import logging

import pytest

from repository_store.config import parse_config
from workers.backends.onnxruntime import SPINNING, session_options


def config(parameters: dict[str, str]):
    text = 'name: "m" backend: "onnxruntime" max_batch_size: 0\n' + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items()
    )
    return parse_config(text, "m")


def test_by_default_threads_are_onnx_runtimes_choice_and_do_not_spin():
    options = session_options(config({}))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert options.get_session_config_entry(SPINNING) == "0"
    assert session_options().get_session_config_entry(SPINNING) == "0"  # no config: the same


def test_tritons_thread_count_parameters_and_spinning_are_read():
    options = session_options(config({"intra_op_thread_count": "3", "inter_op_thread_count": " 2 ",
                                      SPINNING: "1"}))  # fmt: skip
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 2)
    assert options.get_session_config_entry(SPINNING) == "1"


BAD = [("intra_op_thread_count", "-1"), ("inter_op_thread_count", "two"),
       ("intra_op_thread_count", "\u00b2"),  # isdigit(), yet not int()
       ("intra_op_thread_count", "99999999999"), (SPINNING, "yes")]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_a_bad_value_is_logged_and_the_default_kept(key, value, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.backends.onnxruntime"):
        options = session_options(config({key: value}))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert options.get_session_config_entry(SPINNING) == "0"
    assert f"ignoring {key}" in caplog.text
