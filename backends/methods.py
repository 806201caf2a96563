"""Decoding-method catalog and rendering of vLLM `--speculative-config` / `vllm serve` argv."""

# Over 400 lines: the method catalog beside the rules rendering it as vLLM flags.

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeGuard

# The release whose `--speculative-config` fields (dflash, dspark, parallel_drafting) and
# `vllm:*` metrics this project renders and reads (and the simulator's `/version`).
VLLM_VERSION = "0.32.0"


class InvalidMethodSpec(ValueError):
    """A method spec that vLLM would reject or that draftgate cannot render."""

    def __init__(self, message: str, field: str = "method") -> None:
        super().__init__(message)
        # The backend field at fault: method, k, drafter or speculative_options.
        self.field = field


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """What one decoding method is and what a spec for it needs."""

    id: str
    vllm_method: str | None
    speculative: bool
    parallel: bool
    drafter_required: bool
    drafter_allowed: bool
    k_optional: bool
    supports_adaptive_verification: bool
    description: str


def _info(
    method_id: str,
    vllm_method: str | None,
    description: str,
    *,
    parallel: bool = False,
    drafter_required: bool = False,
    drafter_allowed: bool = False,
    k_optional: bool = False,
    adaptive: bool = False,
) -> MethodInfo:
    """Build a catalog entry; a method is speculative iff it maps to a vLLM method."""
    return MethodInfo(
        id=method_id,
        vllm_method=vllm_method,
        speculative=vllm_method is not None,
        parallel=parallel,
        drafter_required=drafter_required,
        drafter_allowed=drafter_allowed or drafter_required,
        k_optional=k_optional,
        supports_adaptive_verification=adaptive,
        description=description,
    )


_CATALOG = (
    _info("plain", None, "No speculative decoding; the target model decodes one token per step."),
    _info(
        "eagle3",
        "eagle3",
        "EAGLE-3 head drafting K tokens autoregressively.",
        drafter_required=True,
    ),
    _info(
        "p-eagle",
        "eagle3",
        "P-EAGLE: an EAGLE-3 head trained to draft all K tokens in one pass.",
        parallel=True,
        drafter_required=True,
    ),
    _info(
        "dflash",
        "dflash",
        "DFlash block-diffusion drafter; all K tokens in one pass.",
        parallel=True,
        drafter_required=True,
    ),
    _info(
        "dspark",
        "dspark",
        "DSpark drafter with a confidence head; may ship in the target.",
        parallel=True,
        drafter_allowed=True,
        adaptive=True,
    ),
    _info("ngram", "ngram", "Prompt-lookup n-gram drafting; no drafter model."),
    _info(
        "suffix",
        "suffix",
        "Suffix-tree drafting (Arctic Inference); K defaults to 24 in vLLM.",
        k_optional=True,
    ),
    _info(
        "mtp",
        "mtp",
        "Target's multi-token-prediction layers; K may come from the checkpoint.",
        drafter_allowed=True,
        k_optional=True,
    ),
    _info(
        "draft_model",
        "draft_model",
        "A smaller standalone draft model, autoregressive.",
        drafter_required=True,
    ),
)

METHODS: Mapping[str, MethodInfo] = MappingProxyType({m.id: m for m in _CATALOG})
METHOD_IDS: tuple[str, ...] = tuple(METHODS)

# Keys the catalog renders itself; `extra` may not override them.
RESERVED_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "method",
        "model",
        "num_speculative_tokens",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "enable_adaptive_verification",
    }
)

# vLLM sets parallel_drafting itself for these, so their canonical configs omit it.
_VLLM_FORCES_PARALLEL = frozenset({"dflash", "dspark"})

ScheduleEntry = tuple[int, int, int]


def _empty_extra() -> Mapping[str, object]:
    """A fresh read-only empty mapping for `MethodSpec.extra`."""
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """How one backend decodes: method, K, drafter and extra vLLM speculative-config keys."""

    method: str
    k: int | None = None
    drafter: str | None = None
    k_per_batch_size: tuple[ScheduleEntry, ...] | None = None
    adaptive_verification: bool = False
    extra: Mapping[str, object] = field(default_factory=_empty_extra, hash=False)


def method_info(method: str) -> MethodInfo:
    """Return the catalog entry for `method` or raise InvalidMethodSpec."""
    try:
        return METHODS[method]
    except KeyError:
        known = ", ".join(METHOD_IDS)
        raise InvalidMethodSpec(f"unknown method {method!r}; known: {known}") from None


def make_spec(
    method: str,
    k: int | None = None,
    drafter: str | None = None,
    *,
    k_per_batch_size: Iterable[Sequence[int]] | None = None,
    adaptive_verification: bool = False,
    extra: Mapping[str, object] | None = None,
) -> MethodSpec:
    """Build a validated MethodSpec, accepting JSON-shaped schedules and extras."""
    schedule = None
    if k_per_batch_size is not None:
        schedule = tuple(_schedule_entry(entry) for entry in k_per_batch_size)
    spec = MethodSpec(
        method=method,
        k=k,
        drafter=drafter,
        k_per_batch_size=schedule,
        adaptive_verification=adaptive_verification,
        extra=MappingProxyType(dict(extra or {})),
    )
    return validate_spec(spec)


def spec_from_options(
    method: str, k: int | None, drafter: str | None, options: Mapping[str, object]
) -> MethodSpec:
    """Build a validated spec from vLLM speculative-config keys beyond method, model and K."""
    extra = dict(options)
    schedule = extra.pop("num_speculative_tokens_per_batch_size", None)
    adaptive = extra.pop("enable_adaptive_verification", False)
    if schedule is not None and not _is_schedule(schedule):
        raise InvalidMethodSpec(
            "num_speculative_tokens_per_batch_size must be a list of [lo, hi, k], "
            f"got {schedule!r}",
            field="speculative_options",
        )
    if not isinstance(adaptive, bool):
        raise InvalidMethodSpec(
            f"enable_adaptive_verification must be a boolean, got {adaptive!r}",
            field="speculative_options",
        )
    return make_spec(
        method, k, drafter, k_per_batch_size=schedule, adaptive_verification=adaptive, extra=extra
    )


def _is_schedule(value: object) -> TypeGuard[list[list[int]]]:
    """Whether `value` is JSON-shaped as a list of integer triples."""
    return isinstance(value, list) and all(
        isinstance(entry, list | tuple)
        and all(isinstance(n, int) and not isinstance(n, bool) for n in entry)
        for entry in value
    )


def _schedule_entry(entry: Sequence[int]) -> ScheduleEntry:
    """Convert one `[lo, hi, k]` schedule entry to a tuple."""
    if len(entry) != 3:
        raise InvalidMethodSpec(
            f"num_speculative_tokens_per_batch_size entries must be [lo, hi, k], got {list(entry)}",
            field="speculative_options",
        )
    return (entry[0], entry[1], entry[2])


def validate_spec(spec: MethodSpec) -> MethodSpec:
    """Return `spec` (plain's k=0 normalised to None) or raise InvalidMethodSpec."""
    info = method_info(spec.method)
    if not info.speculative:
        return _validate_plain(spec)
    _check_k(info, spec.k)
    _check_drafter(info, spec.drafter)
    if spec.k_per_batch_size is not None:
        _check_schedule(info, spec.k, spec.k_per_batch_size)
    if spec.adaptive_verification and not info.supports_adaptive_verification:
        raise InvalidMethodSpec(
            "enable_adaptive_verification is only supported by method 'dspark', "
            f"got method={spec.method!r}",
            field="speculative_options",
        )
    _check_extra(spec.extra)
    return spec


def _validate_plain(spec: MethodSpec) -> MethodSpec:
    """Plain decoding takes nothing but an absent (or zero) K."""
    if spec.k not in (None, 0):
        raise InvalidMethodSpec(
            f"method 'plain' takes no num_speculative_tokens, got k={spec.k}", field="k"
        )
    unexpected = {
        "drafter": spec.drafter,
        "k_per_batch_size": spec.k_per_batch_size,
        "adaptive_verification": spec.adaptive_verification or None,
        "extra": dict(spec.extra) or None,
    }
    for name, value in unexpected.items():
        if value is not None:
            raise InvalidMethodSpec(
                f"method 'plain' takes no {name}, got {name}={value!r}",
                field="drafter" if name == "drafter" else "speculative_options",
            )
    return MethodSpec(method="plain")


def _check_k(info: MethodInfo, k: int | None) -> None:
    """K must be a positive int; only methods whose K vLLM can fill in may leave it unset."""
    if k is None:
        if not info.k_optional:
            raise InvalidMethodSpec(
                f"method {info.id!r} needs num_speculative_tokens (k=None)", field="k"
            )
        return
    if isinstance(k, bool) or not isinstance(k, int):
        raise InvalidMethodSpec(f"num_speculative_tokens must be an int, got k={k!r}", field="k")
    if k <= 0:
        raise InvalidMethodSpec(
            f"num_speculative_tokens must be > 0 for method {info.id!r}, got k={k}", field="k"
        )


def _check_drafter(info: MethodInfo, drafter: str | None) -> None:
    """Drafter present where required, absent where the method has no drafter model."""
    if drafter is None:
        if info.drafter_required:
            raise InvalidMethodSpec(
                f"method {info.id!r} needs a drafter model (drafter=None)", field="drafter"
            )
        return
    if not info.drafter_allowed:
        raise InvalidMethodSpec(
            f"method {info.id!r} does not use a drafter model, got drafter={drafter!r}",
            field="drafter",
        )
    if not drafter.strip():
        raise InvalidMethodSpec(
            f"drafter must be a model name for method {info.id!r}, got drafter={drafter!r}",
            field="drafter",
        )


def _check_schedule(info: MethodInfo, k: int | None, schedule: tuple[ScheduleEntry, ...]) -> None:
    """Entries are (lo, hi, k) with 1 <= lo <= hi, 0 <= k <= K, sorted and non-overlapping."""
    name = "num_speculative_tokens_per_batch_size"
    if k is None:
        raise InvalidMethodSpec(
            f"{name} needs num_speculative_tokens for method {info.id!r} (k=None)",
            field="speculative_options",
        )
    if not schedule:
        raise InvalidMethodSpec(
            f"{name} must not be empty for method {info.id!r}", field="speculative_options"
        )
    prev_hi = 0
    for entry in schedule:
        if len(entry) != 3 or not all(type(v) is int for v in entry):
            raise InvalidMethodSpec(
                f"{name} entries must be [lo, hi, k] ints, got {list(entry)}",
                field="speculative_options",
            )
        lo, hi, entry_k = entry
        if not 1 <= lo <= hi:
            raise InvalidMethodSpec(
                f"{name} entry {list(entry)} needs 1 <= lo <= hi", field="speculative_options"
            )
        if not 0 <= entry_k <= k:
            raise InvalidMethodSpec(
                f"{name} entry {list(entry)} needs 0 <= k <= num_speculative_tokens={k}",
                field="speculative_options",
            )
        if lo <= prev_hi:
            raise InvalidMethodSpec(
                f"{name} entry {list(entry)} overlaps or is out of order (previous hi={prev_hi})",
                field="speculative_options",
            )
        prev_hi = hi


def _check_extra(extra: Mapping[str, object]) -> None:
    """Extra keys may not override rendered keys and must be JSON-serialisable."""
    for key, value in extra.items():
        if key in RESERVED_CONFIG_KEYS:
            raise InvalidMethodSpec(
                f"extra key {key!r} would override a key draftgate renders; "
                "set it through the spec's own field",
                field="speculative_options",
            )
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidMethodSpec(
                f"extra key {key!r} is not JSON-serialisable: {value!r}",
                field="speculative_options",
            ) from exc


def _schedule_json(schedule: tuple[ScheduleEntry, ...]) -> list[list[int]]:
    """Schedule in vLLM's JSON shape: a list of [lo, hi, k]."""
    return [list(entry) for entry in schedule]


def render_speculative_config(spec: MethodSpec) -> dict[str, object] | None:
    """vLLM `--speculative-config` dict for `spec`, or None for plain decoding."""
    spec = validate_spec(spec)
    info = METHODS[spec.method]
    if info.vllm_method is None:
        return None
    config: dict[str, object] = {"method": info.vllm_method}
    if spec.drafter is not None:
        config["model"] = spec.drafter
    if spec.k is not None:
        config["num_speculative_tokens"] = spec.k
    if info.parallel and info.vllm_method not in _VLLM_FORCES_PARALLEL:
        config["parallel_drafting"] = True
    if spec.k_per_batch_size is not None:
        config["num_speculative_tokens_per_batch_size"] = _schedule_json(spec.k_per_batch_size)
    if spec.adaptive_verification:
        config["enable_adaptive_verification"] = True
    config.update(spec.extra)
    return config


def render_vllm_args(
    model: str,
    spec: MethodSpec,
    *,
    port: int | None = None,
    host: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    scheduling: str = "fcfs",
) -> list[str]:
    """Argv for `vllm serve` serving `model` with `spec`, scheduling by priority where
    `scheduling` says so (vLLM's default is first come, first served)."""
    if isinstance(extra_args, str):
        raise TypeError("extra_args must be a sequence of arguments, not a single string")
    argv = ["vllm", "serve", model]
    config = render_speculative_config(spec)
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if scheduling != "fcfs":
        argv += ["--scheduling-policy", scheduling]
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if served_model_name is not None:
        argv += ["--served-model-name", served_model_name]
    argv += extra_args
    return argv


def render_vllm_command(
    model: str,
    spec: MethodSpec,
    *,
    port: int | None = None,
    host: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> str:
    """Shell-quoted `vllm serve` command line for copy-paste."""
    argv = render_vllm_args(
        model,
        spec,
        port=port,
        host=host,
        served_model_name=served_model_name,
        extra_args=extra_args,
    )
    return shlex.join(argv)
