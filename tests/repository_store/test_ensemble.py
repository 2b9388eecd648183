"""Ensemble step graphs: the checks on an ensemble's own config, the checks against its
composing models (readiness derived by :func:`resolve_ensembles`), and the graph's order and
pruning. Pure functions, no server."""

from __future__ import annotations

import pytest

from naiad.errors import ConfigError
from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store import parse_config, resolve_ensembles, validate_config
from repository_store.ensemble import EnsembleGraph, composing_models, dims_agree


def io(name: str, dims: str = "4", data_type: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: [ {dims} ] {extra} }}'


def model(name: str, inputs: list[str], outputs: list[str], mbs: int = 8) -> str:
    return (
        f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {mbs}\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n"
    )


def step(model_name: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model_name}" model_version: {version}{maps} }}'


def ensemble(
    steps: list[str], inputs=None, outputs=None, mbs: int = 8, name: str = "ens", extra: str = ""
) -> str:
    inputs = inputs if inputs is not None else [io("x")]
    outputs = outputs if outputs is not None else [io("y")]
    return (
        f'name: "{name}" platform: "ensemble" max_batch_size: {mbs}\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n{extra}\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


# x -> a -> t1 ; x -> b -> t2 ; (t1, t2) -> c -> y : a and b in parallel, then c
DIAMOND = ensemble(
    [
        step("a", {"in": "x"}, {"out": "t1"}),
        step("b", {"in": "x"}, {"out": "t2"}),
        step("c", {"left": "t1", "right": "t2"}, {"out": "y"}),
    ]
)


def config(text: str, name: str = "ens"):
    return parse_config(text, name)


def entry(text: str, versions=(1,), state: str = READY, reason: str = "") -> ModelEntry:
    cfg = config(text, text.split('"')[1])
    return ModelEntry(cfg.name, cfg, list(versions), state, reason)


def test_graph_order_runs_independent_steps_together() -> None:
    graph = EnsembleGraph.of(config(DIAMOND))
    assert [[s.model_name for s in wave] for wave in graph.order()] == [["a", "b"], ["c"]]
    assert graph.producer == {"t1": 0, "t2": 1, "y": 2}
    assert composing_models(config(DIAMOND)) == ["a", "b", "c"]
    assert str(graph.steps[2]) == "step 2 ('c')"


def test_needed_steps_prunes_what_requested_outputs_do_not_need() -> None:
    text = ensemble(
        [
            step("a", {"in": "x"}, {"out": "y"}),
            step("b", {"in": "x"}, {"out": "t"}),
            step("c", {"in": "t"}, {"out": "z"}),
        ],
        outputs=[io("y"), io("z")],
    )
    validate_config(config(text))
    graph = EnsembleGraph.of(config(text))
    assert [s.model_name for s in graph.needed_steps(["y"])] == ["a"]
    assert [s.model_name for s in graph.needed_steps(["z"])] == ["b", "c"]
    assert [s.model_name for s in graph.needed_steps(["z", "y"])] == ["a", "b", "c"]


def test_a_sound_ensemble_validates() -> None:
    validate_config(config(DIAMOND))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "ens" platform: "ensemble" input [ ' + io("x") + " ] output [ " + io("y") + " ]",
         "must specify ensemble_scheduling with at least one step"),
        (model("ens", [io("x")], [io("y")]) + "ensemble_scheduling { step [ ] }",
         "cannot be set for model 'ens' whose platform is not 'ensemble'"),
        (ensemble([step("", {"in": "x"}, {"out": "y"})]),
         "step 0 of ensemble 'ens' must specify 'model_name'"),
        (ensemble([step("a", {}, {"out": "y"})]), "must specify 'input_map'"),
        (ensemble([step("a", {"in": "x"}, {})]), "must specify 'output_map'"),
        (ensemble([step("a", {"in": "x"}, {"out": "y"}, version=0)]), "model_version 0"),
        (ensemble([step("a", {"in": "x"}, {"out": "y"}), step("b", {"in": "x"}, {"out": "y"})]),
         "ensemble tensor 'y' is produced by both step 0 ('a') and step 1 ('b')"),
        (ensemble([step("a", {"in": "x"}, {"out": "y", "o2": "x"})]),
         "writes 'x', which is an ensemble input"),
        (ensemble([step("a", {"in": "x", "in2": "nowhere"}, {"out": "y"})]),
         "step 0 ('a') reads ensemble tensor 'nowhere' (its input 'in2'), which is neither an ensemble "
         "input nor an output of any step"),
        (ensemble([step("a", {"in": "x", "back": "t2"}, {"out": "t1"}),
                   step("b", {"in": "t1"}, {"out": "t2"}), step("c", {"in": "t2"}, {"out": "y"})]),
         "ensemble 'ens' has a cycle: step 0 ('a'), step 1 ('b'), step 2 ('c') wait on each other's outputs"),
        (ensemble([step("a", {"in": "x"}, {"out": "y"})], inputs=[io("x"), io("unused")]),
         "ensemble input 'unused' of ensemble 'ens' is not used by any step"),
        (ensemble([step("a", {"in": "x"}, {"out": "y"})], outputs=[io("y"), io("z")]),
         "ensemble output 'z' of ensemble 'ens' is not produced by any step"),
        (ensemble([step("a", {"in": "x"}, {"out": "y", "extra": "dangling"})]),
         "ensemble tensor 'dangling' is unused in ensemble 'ens'"),
        (ensemble([step("a", {"in": "x"}, {"out": "y"})], extra="instance_group [ { count: 2 } ]"),
         "instance_group cannot be specified for ensemble 'ens'"),
    ],
)  # fmt: skip
def test_unsound_ensembles_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(config(text))
    assert message in caught.value.message


A = model("a", [io("in")], [io("out")])
B = model("b", [io("in")], [io("out")])
C = model("c", [io("left"), io("right")], [io("out")])


def resolved(*texts: str, **overrides: ModelEntry) -> dict[str, ModelEntry]:
    entries = {e.name: e for e in (entry(t) for t in texts)}
    return resolve_ensembles({**entries, **overrides})


def test_ensemble_ready_when_its_models_are() -> None:
    result = resolved(DIAMOND, A, B, C)
    assert result["ens"].state == READY and result["ens"].reason == ""
    assert {n: e.state for n, e in result.items()} == dict.fromkeys("ens a b c".split(), READY)


def test_missing_model_makes_the_ensemble_unavailable() -> None:
    result = resolved(DIAMOND, A, C)
    assert result["ens"].state == UNAVAILABLE
    assert result["ens"].reason == "ensemble 'ens' contains models that are not in the repository: b"
    assert result["a"].state == READY  # the others are untouched


def test_unready_model_reason_is_carried() -> None:
    broken = ModelEntry("b", None, [], UNAVAILABLE, "version 1 has no 'model.onnx'")
    result = resolved(DIAMOND, A, C, b=broken)
    assert result["ens"].reason == (
        "ensemble 'ens' depends on 'b' which is not ready: version 1 has no 'model.onnx'"
    )


def test_required_version_must_be_served() -> None:
    text = ensemble([step("a", {"in": "x"}, {"out": "y"}, version=2)])
    assert "whose required version 2 is not served (versions [1])" in resolved(text, A)["ens"].reason
    assert resolved(text, a=entry(A, versions=(1, 2)))["ens"].ready


@pytest.mark.parametrize(
    ("composing", "message"),
    [
        (model("a", [io("other")], [io("out")]),
         "step 0 ('a') maps ensemble tensor 'x' to 'in', which is not an input of the model"),
        (model("a", [io("in"), io("second")], [io("out")]),
         "input 'second' of the model is not mapped to any ensemble tensor"),
        (model("a", [io("in")], [io("other")]),
         "maps 'out' to ensemble tensor 'y', but the model has no such output"),
        (model("a", [io("in", data_type="TYPE_INT64")], [io("out")]),
         "ensemble tensor 'x': inconsistent data type: TYPE_FP32 is inferred from ensemble 'ens' while "
         "TYPE_INT64 is inferred from model 'a'"),
        (model("a", [io("in", dims="5")], [io("out")]),
         "ensemble tensor 'x': inconsistent shape: [-1, 4] is inferred from ensemble 'ens' while [-1, 5]"),
        (model("a", [io("in")], [io("out")], mbs=4),
         "ensemble 'ens' allows maximum batch size 8, but it contains model 'a' which only allows "
         "maximum batch size 4"),
    ],
)  # fmt: skip
def test_maps_must_fit_the_composing_model(composing: str, message: str) -> None:
    text = ensemble([step("a", {"in": "x"}, {"out": "y"})])
    result = resolved(text, composing)
    assert result["ens"].state == UNAVAILABLE
    assert message in result["ens"].reason


def test_optional_inputs_wildcards_and_unbatched_models_fit() -> None:
    plain = ensemble([step("a", {"in": "x"}, {"out": "y"})])
    optional = model("a", [io("in"), io("extra", extra="optional: true")], [io("out")])
    assert resolved(plain, optional)["ens"].ready  # an optional input may stay unmapped
    variable = ensemble([step("a", {"in": "x"}, {"out": "y"})], inputs=[io("x", "-1")])
    assert resolved(variable, A)["ens"].ready  # [-1] vs [4]: checked per request
    # a non-batching model whose dims are the ensemble's full shape, batch dimension included
    unbatched = model("a", [io("in", "-1, 4")], [io("out", "-1, 4")], mbs=0)
    assert resolved(plain, unbatched)["ens"].ready
    assert not resolved(plain, model("a", [io("in", "2, 5")], [io("out", "-1, 4")], mbs=0))["ens"].ready


def test_nested_ensembles_and_cycles() -> None:
    inner = ensemble([step("a", {"in": "x"}, {"out": "y"})], name="inner")
    outer = ensemble([step("inner", {"x": "x"}, {"y": "y"})], name="outer")
    assert resolved(outer, inner, A)["outer"].ready
    gone = resolved(outer, inner)  # inner lacks 'a', so outer is not ready either
    assert gone["inner"].reason == "ensemble 'inner' contains models that are not in the repository: a"
    assert gone["outer"].reason == (
        "ensemble 'outer' depends on 'inner' which is not ready: ensemble 'inner' contains models that "
        "are not in the repository: a"
    )
    loop_a = ensemble([step("loop_b", {"x": "x"}, {"y": "y"})], name="loop_a")
    loop_b = ensemble([step("loop_a", {"x": "x"}, {"y": "y"})], name="loop_b")
    result = resolved(loop_a, loop_b)
    assert result["loop_a"].reason == "circular dependency: loop_a -> loop_b -> loop_a"
    assert result["loop_b"].reason == "circular dependency: loop_b -> loop_a -> loop_b"
    itself = ensemble([step("self_ref", {"x": "x"}, {"y": "y"})], name="self_ref")
    assert resolved(itself)["self_ref"].reason == "circular dependency: self_ref -> self_ref"


def test_dims_agree() -> None:
    assert dims_agree([-1, 4], [3, 4]) and dims_agree([2, -1], [-1, 5]) and dims_agree([], [])
    assert not dims_agree([4], [5]) and not dims_agree([4], [4, 1])
