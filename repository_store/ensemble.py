"""Ensemble models (``platform: "ensemble"``): the step graph and its validation.

An ensemble has no model file and no worker; its ``ensemble_scheduling.step`` list says which
models run on which tensors (Triton docs, user_guide/ensemble_models.md and
model_configuration.md "Ensemble Scheduling"). Each step maps its model's input names to
*ensemble tensors* (``input_map``: key = the model's input, value = the ensemble tensor) and
its model's outputs to new ensemble tensors (``output_map``: key = the model's output, value
= the ensemble tensor). Ensemble tensors are the ensemble's inputs, its outputs and the
intermediate tensors the steps produce. ``model_version: -1`` means the newest version.

Two checks, as Triton does them:

- :func:`validate_scheduling` looks at the ensemble's own config only (Triton's
  ``ValidateEnsembleSchedulingConfig``): steps present and complete, every tensor produced
  once, every step input defined, every ensemble input used and output produced, no cycle,
  no tensor produced and then ignored.
- :func:`dependency_reason` checks it against its composing models (Triton's dependency
  graph and ``ValidateEnsembleConfig``): each exists and is ready (an ensemble is ready only
  when its composing models are), the version asked for is served, the maps name real
  inputs and outputs (every required input mapped), each ensemble tensor keeps one datatype
  and a compatible shape, no composing model allows a smaller batch than the ensemble, and
  no ensemble contains itself, directly or through nested ensembles.

Nothing here does I/O; :class:`EnsembleGraph` is also what the gateway's scheduler
(:mod:`gateway.ensemble`) runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ConfigError

PLATFORM = "ensemble"
#: ``model_version`` of a step that takes the newest version the composing model serves.
LATEST = -1


def is_ensemble(config: mc.ModelConfig | None) -> bool:
    """Whether ``config`` is an ensemble's (``platform: "ensemble"``)."""
    return config is not None and config.platform == PLATFORM


@dataclass(frozen=True)
class EnsembleStep:
    """One ``ensemble_scheduling.step``: ``index`` in the config, the composing model and
    version (:data:`LATEST` or a version number), ``input_map`` (model input -> ensemble
    tensor) and ``output_map`` (model output -> ensemble tensor)."""

    index: int
    model_name: str
    model_version: int
    input_map: dict[str, str]
    output_map: dict[str, str]

    def __str__(self) -> str:
        return f"step {self.index} ('{self.model_name}')"


@dataclass(frozen=True)
class EnsembleGraph:
    """The steps of an ensemble and how its tensors flow between them.

    ``producer``: ensemble tensor -> index of the step whose output it is (ensemble inputs
    have none). Built by :meth:`of`, which does not validate (see :func:`validate_scheduling`).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]
    producer: dict[str, int]

    @classmethod
    def of(cls, config: mc.ModelConfig) -> EnsembleGraph:
        steps = tuple(
            EnsembleStep(i, s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
            for i, s in enumerate(config.ensemble_scheduling.step)
        )
        producer = {tensor: step.index for step in steps for tensor in step.output_map.values()}
        return cls(
            config.name,
            tuple(t.name for t in config.input),
            tuple(t.name for t in config.output),
            steps,
            producer,
        )

    def needed_steps(self, outputs: Iterable[str]) -> list[EnsembleStep]:
        """The steps that the ensemble outputs ``outputs`` depend on, in config order: the
        others are pruned, as Triton prunes them when a request asks for fewer outputs."""
        needed: set[int] = set()
        todo = [self.producer[name] for name in outputs if name in self.producer]
        while todo:
            index = todo.pop()
            if index in needed:
                continue
            needed.add(index)
            todo += [self.producer[t] for t in self.steps[index].input_map.values() if t in self.producer]
        return [step for step in self.steps if step.index in needed]

    def order(self) -> list[list[EnsembleStep]]:
        """The steps in waves: each wave's steps need only ensemble inputs and earlier waves'
        outputs, so they can run at the same time. Raises :class:`ConfigError` for a step
        input that nothing defines or for steps that wait on each other (a cycle)."""
        available = set(self.inputs)
        for step in self.steps:
            for model_input, tensor in sorted(step.input_map.items()):
                if tensor not in available and tensor not in self.producer:
                    raise ConfigError(
                        f"in ensemble '{self.name}', {step} reads ensemble tensor '{tensor}' "
                        f"(its input '{model_input}'), which is neither an ensemble input nor "
                        "an output of any step"
                    )
        waves, left = [], list(self.steps)
        while left:
            wave = [s for s in left if all(t in available for t in s.input_map.values())]
            if not wave:
                stuck = ", ".join(str(s) for s in left)
                raise ConfigError(f"ensemble '{self.name}' has a cycle: {stuck} wait on each other's outputs")
            waves.append(wave)
            left = [s for s in left if s not in wave]
            available |= {t for s in wave for t in s.output_map.values()}
        return waves


def validate_scheduling(config: mc.ModelConfig) -> None:
    """Check ``ensemble_scheduling`` against the config it is in (Triton's
    ``ValidateEnsembleSchedulingConfig``); a model that is not an ensemble must not have one.

    :raises ConfigError: naming the first rule broken.
    """
    has_scheduling = config.HasField("ensemble_scheduling")
    if not is_ensemble(config):
        if has_scheduling:
            raise ConfigError(
                f"ensemble_scheduling cannot be set for model '{config.name}' "
                f"whose platform is not '{PLATFORM}'"
            )
        return
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"ensemble '{config.name}' must specify ensemble_scheduling with at least one step")
    for field in ("instance_group", "model_warmup"):
        if len(getattr(config, field)):
            raise ConfigError(f"{field} cannot be specified for ensemble '{config.name}'")
    if config.HasField("optimization"):
        raise ConfigError(f"optimization cannot be specified for ensemble '{config.name}'")
    graph = EnsembleGraph.of(config)
    for step in graph.steps:
        _check_step(graph, step)
    _check_producers(graph)
    graph.order()
    _check_use(graph)


def _check_step(graph: EnsembleGraph, step: EnsembleStep) -> None:
    where = f"step {step.index} of ensemble '{graph.name}'"
    if not step.model_name:
        raise ConfigError(f"{where} must specify 'model_name'")
    if step.model_version < LATEST or step.model_version == 0:
        raise ConfigError(f"{where} has model_version {step.model_version}: use -1 (latest) or >= 1")
    if not step.input_map:
        raise ConfigError(f"{where} must specify 'input_map'")
    if not step.output_map:
        raise ConfigError(f"{where} must specify 'output_map'")


def _check_producers(graph: EnsembleGraph) -> None:
    """Every ensemble tensor is produced once at most, and never an ensemble input."""
    seen: dict[str, EnsembleStep] = {}
    for step in graph.steps:
        for tensor in step.output_map.values():
            if tensor in graph.inputs:
                raise ConfigError(
                    f"in ensemble '{graph.name}', {step} writes '{tensor}', which is an ensemble input"
                )
            if tensor in seen:
                raise ConfigError(
                    f"in ensemble '{graph.name}', ensemble tensor '{tensor}' is produced by both "
                    f"{seen[tensor]} and {step}: it can appear in an output map only once"
                )
            seen[tensor] = step


def _check_use(graph: EnsembleGraph) -> None:
    """Every ensemble input is read, every output produced, every intermediate tensor read."""
    read = {tensor for step in graph.steps for tensor in step.input_map.values()}
    for name in graph.inputs:
        if name not in read:
            raise ConfigError(f"ensemble input '{name}' of ensemble '{graph.name}' is not used by any step")
    for name in graph.outputs:
        if name not in graph.producer:
            raise ConfigError(
                f"ensemble output '{name}' of ensemble '{graph.name}' is not produced by any step"
            )
    for name in sorted(graph.producer):
        if name not in read and name not in graph.outputs:
            raise ConfigError(
                f"ensemble tensor '{name}' is unused in ensemble '{graph.name}': no step reads it "
                "and it is not an ensemble output"
            )


def composing_models(config: mc.ModelConfig) -> list[str]:
    """The names of the models an ensemble's steps run, sorted, each once."""
    return sorted({step.model_name for step in config.ensemble_scheduling.step})


class Entry(Protocol):
    """What :func:`dependency_reason` reads of a registry entry
    (:class:`naiad.registry.ModelEntry`)."""

    config: mc.ModelConfig | None
    versions: list[int]
    reason: str

    @property
    def ready(self) -> bool: ...


def dependency_reason(name: str, entries: Mapping[str, Entry], path: Sequence[str] = ()) -> str:
    """Why ensemble ``name`` (whose own config is valid) cannot be served given the other
    models' entries (``''``: it can). ``path``: the ensembles that led here (nested ones)."""
    if name in path:
        return "circular dependency: " + " -> ".join([*path[path.index(name) :], name])
    config = entries[name].config
    assert config is not None
    missing = [m for m in composing_models(config) if m not in entries]
    if missing:
        return f"ensemble '{name}' contains models that are not in the repository: {', '.join(missing)}"
    for step in EnsembleGraph.of(config).steps:
        reason = _step_reason(name, step, entries, (*path, name))
        if reason:
            return reason
    return _tensors_reason(config, entries)


def _step_reason(name: str, step: EnsembleStep, entries: Mapping[str, Entry], path: Sequence[str]) -> str:
    entry = entries[step.model_name]
    reason = entry.reason if not entry.ready or entry.config is None else ""
    if not reason and is_ensemble(entry.config):
        reason = dependency_reason(step.model_name, entries, path)
        if reason.startswith("circular dependency"):
            return reason
    if reason:
        return f"ensemble '{name}' depends on '{step.model_name}' which is not ready: {reason}"
    if step.model_version != LATEST and step.model_version not in entry.versions:
        return (
            f"ensemble '{name}' depends on '{step.model_name}' whose required version "
            f"{step.model_version} is not served (versions {entry.versions})"
        )
    config = entries[name].config
    model = entry.config
    assert config is not None and model is not None
    if model.max_batch_size and model.max_batch_size < config.max_batch_size:
        return (
            f"ensemble '{name}' allows maximum batch size {config.max_batch_size}, but it contains "
            f"model '{step.model_name}' which only allows maximum batch size {model.max_batch_size}"
        )
    return _maps_reason(name, step, model)


def _maps_reason(name: str, step: EnsembleStep, model: mc.ModelConfig) -> str:
    where = f"in ensemble '{name}', {step}"
    inputs = {t.name: t for t in model.input}
    outputs = {t.name for t in model.output}
    for key, tensor in sorted(step.input_map.items()):
        if key not in inputs:
            return f"{where} maps ensemble tensor '{tensor}' to '{key}', which is not an input of the model"
    for key in sorted(inputs):
        if key not in step.input_map and not inputs[key].optional:
            return f"{where}: input '{key}' of the model is not mapped to any ensemble tensor"
    for key, tensor in sorted(step.output_map.items()):
        if key not in outputs:
            return f"{where} maps '{key}' to ensemble tensor '{tensor}', but the model has no such output"
    return ""


@dataclass(frozen=True)
class _TensorUse:
    """An ensemble tensor as one config sees it: datatype, dims, whether batched, by whom."""

    data_type: int
    dims: tuple[int, ...]
    batched: bool
    source: str

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batched else ()) + self.dims


def _tensors_reason(config: mc.ModelConfig, entries: Mapping[str, Entry]) -> str:
    """Each ensemble tensor has one datatype and compatible shapes wherever it is used."""
    uses: dict[str, list[_TensorUse]] = {}
    ensemble_batched = config.max_batch_size > 0
    for io in [*config.input, *config.output]:
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        uses.setdefault(io.name, []).append(
            _TensorUse(io.data_type, tuple(dims), ensemble_batched, f"ensemble '{config.name}'")
        )
    for step in EnsembleGraph.of(config).steps:
        model = entries[step.model_name].config
        assert model is not None
        specs = {t.name: t for t in [*model.input, *model.output]}
        for key, tensor in [*step.input_map.items(), *step.output_map.items()]:
            spec = specs[key]
            batched = model.max_batch_size > 0
            uses.setdefault(tensor, []).append(
                _TensorUse(spec.data_type, tuple(spec.dims), batched, f"model '{model.name}'")
            )
    for tensor, found in sorted(uses.items()):
        reason = _consistency_reason(config.name, tensor, found)
        if reason:
            return reason
    return ""


def _consistency_reason(ensemble: str, tensor: str, uses: list[_TensorUse]) -> str:
    first = uses[0]
    for other in uses[1:]:
        where = f"in ensemble '{ensemble}', ensemble tensor '{tensor}'"
        if other.data_type != first.data_type:
            return (
                f"{where}: inconsistent data type: {mc.DataType.Name(first.data_type)} is inferred "
                f"from {first.source} while {mc.DataType.Name(other.data_type)} is inferred "
                f"from {other.source}"
            )
        if not (dims_agree(first.dims, other.dims) or dims_agree(first.full_dims, other.full_dims)):
            return (
                f"{where}: inconsistent shape: {list(first.full_dims)} is inferred from {first.source} "
                f"while {list(other.full_dims)} is inferred from {other.source}"
            )
    return ""


def dims_agree(a: Sequence[int], b: Sequence[int]) -> bool:
    """Same rank and every dimension equal or ``-1`` on either side (Triton's
    ``CompareDimsWithWildcard``)."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))
