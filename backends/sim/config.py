"""How one simulated server is set up, and building its engine from the planner's data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from backends.methods import METHODS, VLLM_VERSION, method_info
from backends.sim.engine import EngineCore, EngineLimits
from backends.sim.prefix_cache import DEFAULT_BLOCK_SIZE, PrefixCache
from planner import calibration, catalog
from planner.acceptance import AcceptanceProfile
from planner.specdec import StepTimeModel

# K when none is given: where each method family peaks at low load (published results).
DEFAULT_K = {
    "eagle3": 3,
    "p-eagle": 7,
    "dflash": 7,
    "dspark": 7,
    "ngram": 4,
    "suffix": 8,
    "mtp": 1,
    "draft_model": 4,
}
DEFAULT_MAX_MODEL_LEN = 32768  # keeps the demo's KV math and histograms at a usual size


@dataclass(frozen=True)
class Faults:
    """Fault switches for reliability tests; all off by default."""

    error_rate: float = 0.0  # fraction of requests answered with HTTP 500
    stall_rate: float = 0.0  # fraction of streams that stop sending mid-way
    drop_rate: float = 0.0  # fraction of streams whose connection is cut mid-way
    crash_after_s: float | None = None  # the process exits (code 1) this long after start
    startup_delay_s: float = 0.0  # time before the server accepts connections
    delay_s: float = 0.0  # time every completion waits before its response starts (slow)
    poison: str = ""  # a prompt containing this text is answered with HTTP 500, always
    # A lossy verify path: this fraction of answers leave the target's tokens from token
    # `diverge_at` on (what speculation must never do: tests of the lossless watchdog)
    diverge_rate: float = 0.0
    diverge_at: float = 0.0

    def updated(self, changes: dict[str, object]) -> Faults:
        """These switches with `changes` applied; ValueError names a bad key or value."""
        allowed = set(self.__dataclass_fields__)
        for key, value in changes.items():
            if key not in allowed:
                raise ValueError(
                    f"unknown fault switch {key!r}; known: {', '.join(sorted(allowed))}"
                )
            if value is None and key == "crash_after_s":
                continue
            if key == "poison":
                if not isinstance(value, str):
                    raise ValueError(f"poison must be a string, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{key} must be a number >= 0, got {value!r}")
            if key.endswith("_rate") and value > 1:
                raise ValueError(f"{key} must be between 0 and 1, got {value!r}")
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SimConfig:
    """One simulated vLLM server: what it serves, how, on what, and how fast."""

    model: str
    method: str = "plain"
    k: int | None = None
    gpu: str = "B200"
    gpu_count: int = 1
    workload: str = "chat"
    served_model_name: str | None = None
    time_scale: float = 1.0
    max_num_seqs: int = 256
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: "fcfs" or "priority"
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True  # vLLM's default
    block_size: int = DEFAULT_BLOCK_SIZE
    adaptive_verification: bool = False
    per_request_spec_metrics: bool = False
    # vLLM's --enable-prompt-tokens-details: usage says the prompt tokens found cached
    enable_prompt_tokens_details: bool = False
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    api_key: str | None = field(default=None, repr=False)  # as vLLM's --api-key: /v1 only
    engine_version: str = VLLM_VERSION  # what its `/version` says (an upgrade, simulated)

    @property
    def name(self) -> str:
        """The model name clients send."""
        return self.served_model_name or self.model

    @property
    def num_speculative_tokens(self) -> int:
        """K, or 0 for plain decoding."""
        if not method_info(self.method).speculative:
            return 0
        return self.k if self.k is not None else DEFAULT_K[self.method]

    def check(self) -> None:
        """Raise ValueError naming what is wrong with this configuration."""
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; known: {', '.join(METHODS)}")
        catalog.model(self.model), catalog.gpu(self.gpu)  # raise with the known names
        if self.workload not in calibration.workloads():
            known = ", ".join(calibration.workloads())
            raise ValueError(f"unknown workload {self.workload!r}; known: {known}")
        if self.k is not None and self.k <= 0 and method_info(self.method).speculative:
            raise ValueError(f"--k must be > 0 for method {self.method!r}, got {self.k}")
        if self.adaptive_verification and self.method != "dspark":
            raise ValueError(f"adaptive verification needs method dspark, got {self.method!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"--scheduling-policy is fcfs or priority, not {self.scheduling_policy!r}"
            )
        if self.time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale}")
        if self.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {self.block_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


def step_time_model(config: SimConfig) -> StepTimeModel:
    """The performance model of this server's target, drafter and GPUs."""
    k = config.num_speculative_tokens
    return StepTimeModel(
        model=catalog.model(config.model),
        gpu=catalog.gpu(config.gpu),
        gpu_count=config.gpu_count,
        calibration=calibration.engine_calibration(),
        drafter=calibration.drafters().get(config.method) if k else None,
        k=k,
    )


def acceptance_profile(config: SimConfig, workload: str | None = None) -> AcceptanceProfile | None:
    """The acceptance profile of this server's drafter on a workload."""
    if not config.num_speculative_tokens:
        return None
    name = catalog.model(config.model).name
    return calibration.acceptance_profile(name, config.method, workload or config.workload)


def max_model_len(config: SimConfig) -> int:
    """Context limit: as configured, else the model's, capped for the demo."""
    return config.max_model_len or min(
        catalog.model(config.model).max_context, DEFAULT_MAX_MODEL_LEN
    )


def build_engine(config: SimConfig) -> EngineCore:
    """An engine core for this configuration, with vLLM's KV budget from GPU memory."""
    model = step_time_model(config)
    memory = model.gpu.memory_bytes * config.gpu_count * config.gpu_memory_utilization
    kv_cache_bytes = memory - model.model.weight_bytes()
    if kv_cache_bytes <= 0:
        raise ValueError(
            f"{model.model.name} ({model.model.weight_bytes() / 1e9:.0f} GB of weights) does not "
            f"fit on {config.gpu_count}x {model.gpu.name}; raise --gpu-count"
        )
    limits = EngineLimits(
        max_num_seqs=config.max_num_seqs,
        by_priority=config.scheduling_policy == "priority",
        max_num_batched_tokens=config.max_num_batched_tokens,
        kv_cache_bytes=kv_cache_bytes,
        max_model_len=max_model_len(config),
    )
    block_bytes = model.model.kv_bytes_for_context(config.block_size)
    cache = (
        PrefixCache(config.block_size, int(kv_cache_bytes // block_bytes))
        if config.enable_prefix_caching
        else None
    )
    return EngineCore(
        model,
        limits,
        adaptive_verification=config.adaptive_verification,
        prefix_cache=cache,
        seed=config.seed,
    )
