"""Traffic between a model's versions: canary / A/B split, shadow copies, automatic rollback.

Set per model in the config's ``parameters``, which Triton itself ignores (so the file stays
valid for Triton)::

    parameters { key: "naiad.traffic_split" value: { string_value: "1:90,2:10" } }
    parameters { key: "naiad.shadow_version" value: { string_value: "2:25" } }
    parameters { key: "naiad.rollback_error_rate" value: { string_value: "0.05" } }
    parameters { key: "naiad.rollback_min_requests" value: { string_value: "50" } }

- ``naiad.traffic_split``: ``version:weight`` pairs, integer weights summing to 100, each
  version served by the version policy, each once. A request that names no version goes to
  a version by weight (:func:`pick_version`); one naming a version always gets it. With a
  route key (HTTP header ``Naiad-Route-Key``, gRPC metadata ``naiad-route-key``) the choice
  is a hash of the model and the key, so the same key lands on the same version while the
  split is unchanged (A/B tests); without one it is random.
- ``naiad.shadow_version``: ``version:percent``: that share of the requests answered by
  another version is also sent to this version; its answers are discarded, never delay the
  caller, and are counted apart.
- ``naiad.rollback_error_rate`` (a ratio in (0, 1]) with ``naiad.rollback_min_requests``
  (an integer >= 1, default :data:`DEFAULT_MIN_REQUESTS`): a version of the split whose
  failure ratio over its last ``min_requests`` requests passes the rate is rolled back: its
  weight goes to the others (:func:`without`) until the config changes. Needs a split.

An invalid value is ignored with a warning, as the other ``naiad.*`` keys are
(:func:`parse_rollout` returns the problems). Pure functions: no Redis, no transport.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: HTTP header, and gRPC metadata key, of a request's route key (sticky assignment).
ROUTE_HEADER = "Naiad-Route-Key"
ROUTE_METADATA = "naiad-route-key"

SPLIT_KEY = "naiad.traffic_split"
SHADOW_KEY = "naiad.shadow_version"
RATE_KEY = "naiad.rollback_error_rate"
MIN_REQUESTS_KEY = "naiad.rollback_min_requests"
KEYS = (SPLIT_KEY, SHADOW_KEY, RATE_KEY, MIN_REQUESTS_KEY)
#: Requests a version must have answered before its failure ratio can roll it back.
DEFAULT_MIN_REQUESTS = 50
#: Largest window of recent requests a rollback looks at (bounds the gateway's memory).
MAX_MIN_REQUESTS = 100_000

Split = tuple[tuple[int, int], ...]
"""``((version, weight), ...)``, ascending by version, weights summing to 100."""


@dataclass(frozen=True)
class RolloutPolicy:
    """A model's traffic rules; the defaults mean none (every request to the newest)."""

    split: Split = ()
    shadow: tuple[int, int] | None = None
    """``(version, percent)`` of the shadow copies."""
    rollback_error_rate: float | None = None
    rollback_min_requests: int = DEFAULT_MIN_REQUESTS

    @property
    def active(self) -> bool:
        return bool(self.split or self.shadow)


NONE = RolloutPolicy()


def config_digest(config: object) -> str:
    """SHA-256 (hex) of a model config's deterministic protobuf bytes: a rollback decision
    holds while the config it was taken under is the model's."""
    return hashlib.sha256(config.SerializeToString(deterministic=True)).hexdigest()  # type: ignore[attr-defined]


def rollback_field(model: str, version: int) -> str:
    """The :data:`naiad.keys.ROLLBACKS` field of ``version`` of ``model``."""
    return f"{model}/{version}"


def rollback_value(config: object, reason: str) -> bytes:
    """A :data:`naiad.keys.ROLLBACKS` value: the config's digest (64 hex digits), a space,
    the reason."""
    return f"{config_digest(config)} {reason}".encode()


def parse_rollbacks(raw: Mapping[bytes, bytes], digests: Mapping[str, str]) -> dict[str, dict[int, str]]:
    """The rollbacks in force, model -> version -> reason, from the :data:`naiad.keys.ROLLBACKS`
    hash (``raw``) and each model's current config digest (``digests``); decisions taken
    under another config, and malformed fields, are left out."""
    result: dict[str, dict[int, str]] = {}
    for field, value in raw.items():
        model, _, version = field.decode(errors="replace").rpartition("/")
        digest, _, reason = value.decode(errors="replace").partition(" ")
        if version.isdigit() and digest == digests.get(model):
            result.setdefault(model, {})[int(version)] = reason
    return result


def parse_split(text: str, served: Sequence[int]) -> Split:
    """``"1:90,2:10"`` as a :data:`Split`. Raises ``ValueError`` naming what is wrong."""
    pairs: dict[int, int] = {}
    for part in text.split(","):
        version, weight = _pair(part)
        if version in pairs:
            raise ValueError(f"version {version} is given twice")
        pairs[version] = weight
    if sum(pairs.values()) != 100:
        raise ValueError(f"the weights sum to {sum(pairs.values())}, not 100")
    unserved = sorted(set(pairs) - set(served))
    if unserved:
        raise ValueError(f"version {unserved[0]} is not served (versions {list(served)})")
    return tuple(sorted(pairs.items()))


def parse_shadow(text: str, served: Sequence[int]) -> tuple[int, int]:
    """``"2:25"`` as ``(version, percent)`` (1..100). Raises ``ValueError``."""
    version, percent = _pair(text)
    if not 1 <= percent <= 100:
        raise ValueError(f"the percentage must be 1..100, got {percent}")
    if version not in served:
        raise ValueError(f"version {version} is not served (versions {list(served)})")
    return version, percent


def _pair(text: str) -> tuple[int, int]:
    version, sep, number = text.strip().partition(":")
    if not sep or not version.strip().isdigit() or not number.strip().isdigit():
        raise ValueError(f"{text.strip()!r} is not 'version:number' (non-negative integers)")
    return int(version), int(number)


def _rate(text: str) -> float:
    rate = float(text)
    if not 0 < rate <= 1:
        raise ValueError(f"the failure ratio must be in (0, 1], got {text!r}")
    return rate


def _min_requests(text: str) -> int:
    count = int(text)
    if not 1 <= count <= MAX_MIN_REQUESTS:
        raise ValueError(f"must be an integer in 1..{MAX_MIN_REQUESTS}, got {text!r}")
    return count


def parse_rollout(parameters: Mapping[str, str], served: Sequence[int]) -> tuple[RolloutPolicy, list[str]]:
    """The policy of a model whose config's ``parameters`` (key -> string value) are given
    and whose policy serves ``served``, and one message per invalid key, which is left out."""
    fields: dict = {}
    problems: list[str] = []
    parsers: dict[str, tuple[str, Callable[[str], object]]] = {
        SPLIT_KEY: ("split", lambda text: parse_split(text, served)),
        SHADOW_KEY: ("shadow", lambda text: parse_shadow(text, served)),
        RATE_KEY: ("rollback_error_rate", _rate),
        MIN_REQUESTS_KEY: ("rollback_min_requests", _min_requests),
    }
    for key, (name, parse) in parsers.items():
        if key not in parameters:
            continue
        try:
            fields[name] = parse(parameters[key])
        except ValueError as exc:
            problems.append(f"parameter {key}={parameters[key]!r} ignored: {exc}")
    if "rollback_error_rate" in fields and not fields.get("split"):
        problems.append(f"parameter {RATE_KEY} ignored: it needs a valid {SPLIT_KEY}")
        del fields["rollback_error_rate"]
    return RolloutPolicy(**fields), problems


def policy_of(config: object, served: Sequence[int]) -> tuple[RolloutPolicy, list[str]]:
    """:func:`parse_rollout` of a model config's (``ModelConfig``; None: no rules) ``naiad.*``
    traffic parameters."""
    found = getattr(config, "parameters", None) or {}
    parameters = {key: found[key].string_value for key in KEYS if key in found}
    return parse_rollout(parameters, served) if parameters else (NONE, [])


def without(split: Split, rolled_back: set[int] | frozenset[int]) -> Split:
    """``split`` with the ``rolled_back`` versions taken out and their weight given to the
    others in proportion (largest remainder, so the weights still sum to 100); ``()`` when
    none is left."""
    kept = [(v, w) for v, w in split if v not in rolled_back]
    total = sum(w for _, w in kept)
    if not kept or total == 0:
        return ()
    shares = [(v, w * 100 / total) for v, w in kept]
    weights = {v: int(share) for v, share in shares}
    by_remainder = sorted(shares, key=lambda vs: vs[1] - int(vs[1]), reverse=True)
    for v, _ in by_remainder[: 100 - sum(weights.values())]:
        weights[v] += 1
    return tuple((v, weights[v]) for v, _ in kept if weights[v])


def bucket(model: str, route_key: str) -> float:
    """A point in [0, 100) fixed by ``model`` and ``route_key`` (SHA-256): the same key always
    picks the same version of a split."""
    digest = hashlib.sha256(f"{model}\0{route_key}".encode(errors="surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100


def pick_version(split: Split, model: str, route_key: str | None = None,
                 draw: Callable[[], float] = random.random) -> int:  # fmt: skip
    """The version of ``split`` (non-empty) a request gets: by :func:`bucket` of its route
    key, else by ``draw()`` (uniform in [0, 1))."""
    point = bucket(model, route_key) if route_key else draw() * 100
    cumulative = 0
    for version, weight in split:
        cumulative += weight
        if point < cumulative:
            return version
    return split[-1][0]


def shadow_copy(policy: RolloutPolicy, version: int, draw: Callable[[], float] = random.random) -> int | None:
    """The shadow version a request answered by ``version`` is copied to, or None."""
    if policy.shadow is None or policy.shadow[0] == version:
        return None
    return policy.shadow[0] if draw() * 100 < policy.shadow[1] else None


def failure_ratio_passed(outcomes: Sequence[bool], policy: RolloutPolicy) -> float | None:
    """The failure ratio of ``outcomes`` (True: a success; the version's last requests) when
    there are ``rollback_min_requests`` of them and it passes ``rollback_error_rate``, else
    None."""
    if policy.rollback_error_rate is None or len(outcomes) < policy.rollback_min_requests:
        return None
    ratio = sum(not ok for ok in outcomes) / len(outcomes)
    return ratio if ratio > policy.rollback_error_rate else None
