"""``config_to_triton_json``: the config as Triton's ``ModelConfigToJson`` writes it (what a
Python model reads from ``args["model_config"]``)."""

from __future__ import annotations

from repository_store import config_to_triton_json, parse_config

TEXT = """
backend: "python"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "B" data_type: TYPE_STRING dims: [ 1 ] } ]
version_policy { specific { versions: [ 1, 3 ] } }
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 2
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 5 } }
}
parameters { key: "k" value { string_value: "v" } }
"""


def test_int64_fields_are_numbers_and_defaults_are_printed():
    data = config_to_triton_json(parse_config(TEXT, "m"))
    assert data["input"][0]["dims"] == [-1, 4] and data["input"][0]["reshape"] == {"shape": [2, 2]}
    assert data["input"][0]["data_type"] == "TYPE_FP32" and data["input"][0]["optional"] is False
    assert data["output"][0]["dims"] == [1] and data["output"][0]["label_filename"] == ""
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    batching = data["dynamic_batching"]
    assert (batching["max_queue_delay_microseconds"], batching["priority_levels"]) == (100, 2)
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 5  # map keys: strings
    assert data["parameters"] == {"k": {"string_value": "v"}}
    assert (data["platform"], data["instance_group"], data["model_warmup"]) == ("", [], [])
    assert data["max_batch_size"] == 8 and data["name"] == "m"


def test_an_empty_config_prints_its_defaults():
    data = config_to_triton_json(parse_config('backend: "python"', "m"))
    assert (data["max_batch_size"], data["input"], data["output"]) == (0, [], [])
    assert "dynamic_batching" not in data  # a message field without presence is left out
