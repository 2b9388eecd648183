"""``workers/backends/pytorch.py``: Triton's PyTorch tensor naming rules (forward-argument
names, ``<name>__<index>``, config order; dict inputs; tuple/list/dict results), datatypes, and
the errors of a model that disagrees with its config. Real TorchScript files, scripted here."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InferenceFailed, InvalidInput, ModelNotReady
from workers.backends import load_backend
from workers.backends.pytorch import input_positions, named_index, output_positions


class AddSub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y


class DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] * 10 + inputs["b"]


class ListResult(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]


class DictResult(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"double": x * 2, "half": x / 2}


class Upper(torch.nn.Module):
    def forward(self, words: list[str]) -> list[str]:
        return [word.upper() for word in words]


class Cast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.to(torch.bfloat16) * 2, (x > 0)


def save(module: torch.nn.Module, folder: Path, filename: str = "model.pt") -> Path:
    """Script ``module`` into ``folder/1/filename``; returns the version folder."""
    version = folder / "1"
    version.mkdir(parents=True)
    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(version / filename))
    return version


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(f'name: "m" platform: "pytorch_libtorch"\n{text}', mc.ModelConfig())


def io(kind: str, names: list[str], data_type: str = "TYPE_FP32", dims: str = "[ 2 ]") -> str:
    return "\n".join(f'{kind} {{ name: "{n}" data_type: {data_type} dims: {dims} }}' for n in names)


ADD = io("input", ["x", "y"]) + io("output", ["s"])
X = np.array([[1.0, 2.0]], np.float32)
Y = np.array([[10.0, 20.0]], np.float32)


# --- the naming rules, as pure functions --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "index"),
    [("input__0", 0), ("INPUT__12", 12), ("a__b__3", None), ("x__", None), ("x_1", None), ("x__1a", None),
     ("x__²", None), ("plain", None)],
)  # fmt: skip
def test_named_index(name: str, index: int | None) -> None:
    assert named_index(name) == index


def test_inputs_named_after_forward_arguments_win() -> None:
    # Names that are forward arguments are matched by name, whatever the config order.
    assert input_positions(["y", "x"], ["x", "y"]) == {"y": 1, "x": 0}
    # Even names that also look indexed: FORWARD_ARGUMENT is tried first.
    assert input_positions(["b__0", "a__1"], ["a__1", "b__0"]) == {"b__0": 1, "a__1": 0}


def test_inputs_by_index_then_config_order(caplog: pytest.LogCaptureFixture) -> None:
    assert input_positions(["input__1", "input__0"], ["x", "y"]) == {"input__1": 1, "input__0": 0}
    with caplog.at_level(logging.WARNING, "workers.backends.pytorch"):
        assert input_positions(["second", "first"], ["x", "y"]) == {"second": 0, "first": 1}
    assert "naming convention" in caplog.text


def test_outputs_by_index_else_config_order() -> None:
    assert output_positions(["output__1", "output__0"]) == {"output__1": 1, "output__0": 0}
    assert output_positions(["sum", "output__0"]) == {"sum": 0, "output__0": 1}


# --- loaded models --------------------------------------------------------------------------------


def test_named_index_inputs_and_outputs(tmp_path: Path) -> None:
    version = save(AddSub(), tmp_path)
    cfg = config(io("input", ["INPUT__1", "INPUT__0"]) + io("output", ["OUTPUT__1", "OUTPUT__0"]))
    backend = load_backend(version, cfg, "cpu")
    out = backend.infer({"INPUT__0": X, "INPUT__1": Y}, [])
    np.testing.assert_array_equal(out["OUTPUT__0"], X + Y)
    np.testing.assert_array_equal(out["OUTPUT__1"], X - Y)
    assert list(backend.infer({"INPUT__0": X, "INPUT__1": Y}, ["OUTPUT__1"])) == ["OUTPUT__1"]


def test_forward_argument_names(tmp_path: Path) -> None:
    version = save(AddSub(), tmp_path)
    backend = load_backend(version, config(io("input", ["y", "x"]) + io("output", ["sum", "diff"])), "cpu")
    out = backend.infer({"x": X, "y": Y}, [])
    np.testing.assert_array_equal(out["sum"], X + Y)
    np.testing.assert_array_equal(out["diff"], X - Y)  # x - y: y was bound by name, not position


def test_strict_config_order(tmp_path: Path) -> None:
    version = save(AddSub(), tmp_path)
    backend = load_backend(version, config(io("input", ["b", "a"]) + io("output", ["sum", "diff"])), "cpu")
    np.testing.assert_array_equal(backend.infer({"b": X, "a": Y}, ["diff"])["diff"], X - Y)


def test_dict_input(tmp_path: Path) -> None:
    version = save(DictInput(), tmp_path)
    backend = load_backend(version, config(io("input", ["b", "a"]) + io("output", ["output__0"])), "cpu")
    np.testing.assert_array_equal(backend.infer({"a": X, "b": Y}, [])["output__0"], X * 10 + Y)


def test_list_and_dict_results(tmp_path: Path) -> None:
    listed = load_backend(save(ListResult(), tmp_path / "l"),
                          config(io("input", ["x"]) + io("output", ["o__1", "o__0"])), "cpu")  # fmt: skip
    out = listed.infer({"x": X}, [])
    np.testing.assert_array_equal(out["o__0"], X * 2)
    np.testing.assert_array_equal(out["o__1"], X * 3)
    keyed = load_backend(save(DictResult(), tmp_path / "d"),
                         config(io("input", ["x"]) + io("output", ["half", "double"])), "cpu")  # fmt: skip
    np.testing.assert_array_equal(keyed.infer({"x": X}, ["half"])["half"], X / 2)


def test_bf16_and_bool(tmp_path: Path) -> None:
    outputs = io("output", ["y__0"], "TYPE_BF16") + io("output", ["y__1"], "TYPE_BOOL")
    cfg = config(io("input", ["x"]) + outputs)
    backend = load_backend(save(Cast(), tmp_path), cfg, "cpu")
    x = np.array([[1.5, -2.0]], np.float32)
    out = backend.infer({"x": x}, [])
    assert out["y__0"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(out["y__0"].astype(np.float32), x * 2)
    np.testing.assert_array_equal(out["y__1"], x > 0)


def test_strings_are_lists(tmp_path: Path) -> None:
    strings = ("TYPE_STRING", "[ -1 ]")
    cfg = config(io("input", ["words"], *strings) + io("output", ["out__0"], *strings))
    backend = load_backend(save(Upper(), tmp_path), cfg, "cpu")
    out = backend.infer({"words": np.array([b"ab", "é".encode()], dtype=object)}, [])["out__0"]
    assert out.dtype == object and out.tolist() == [b"AB", "é".encode()]  # TorchScript upper(): ASCII
    with pytest.raises(InvalidInput, match="UTF-8"):
        backend.infer({"words": np.array([b"\xff"], dtype=object)}, [])


def test_default_model_filename(tmp_path: Path) -> None:
    version = save(AddSub(), tmp_path, "addsub.torchscript")
    cfg = config('default_model_filename: "addsub.torchscript"\n' + ADD)
    np.testing.assert_array_equal(load_backend(version, cfg, "cpu").infer({"x": X, "y": Y}, [])["s"], X + Y)


def test_cuda_falls_back_to_cpu_without_a_gpu(tmp_path: Path) -> None:
    backend = load_backend(save(AddSub(), tmp_path), config(ADD), "cuda")
    assert backend.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


# --- models that disagree with their config --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (io("input", ["x"]) + io("output", ["s"]), "configuration expects 1 inputs, model provides 2"),
        (io("input", ["x", "y", "z"]) + io("output", ["s"]), "configuration expects 3 inputs"),
        (io("input", ["in__0", "in__5"]) + io("output", ["s"]), "input 'in__5' refers to forward argument 5"),
        (io("input", ["x", "y"]) + io("output", ["out__2"]), "output 'out__2' refers to result 2"),
        (io("input", ["x", "y"], "TYPE_UINT16") + io("output", ["s"]), "unsupported datatype TYPE_UINT16"),
    ],
)
def test_config_mismatch_does_not_load(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ModelNotReady, match="unable to load model 'm' version 1 \\(pytorch\\)") as caught:
        load_backend(save(AddSub(), tmp_path), config(text), "cpu")
    assert message in caught.value.message


def test_wrong_output_datatype_fails_the_request(tmp_path: Path) -> None:
    cfg = config(io("input", ["x", "y"]) + io("output", ["s"], "TYPE_INT64"))
    backend = load_backend(save(AddSub(), tmp_path), cfg, "cpu")
    with pytest.raises(InferenceFailed, match="configuration expects datatype TYPE_INT64 for output 's', "
                                              "model provides TYPE_FP32"):  # fmt: skip
        backend.infer({"x": X, "y": Y}, [])


def test_not_torchscript_does_not_load(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.pt").write_bytes(b"not a TorchScript archive")
    with pytest.raises(ModelNotReady, match="unable to load model 'm' version 1"):
        load_backend(tmp_path / "1", config(io("input", ["x"]) + io("output", ["y"])), "cpu")
    with pytest.raises(ModelNotReady, match="unable to load model 'm' version 2"):
        load_backend(tmp_path / "2", config(io("input", ["x"]) + io("output", ["y"])), "cpu")


def test_thread_counts_from_triton_parameters(tmp_path: Path) -> None:
    version = save(AddSub(), tmp_path)
    before = torch.get_num_threads()
    try:
        text = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n' + ADD
        load_backend(version, config(text), "cpu")
        assert torch.get_num_threads() == 1
        load_backend(version, config(ADD), "cpu")
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)
