"""Request and response shapes of the admin API (the same keys as `fleet.yaml`)."""

# Over 400 lines: every admin API request and response shape (fleet.yaml's keys) in one place.

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, Self, TypeVar, get_args

from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from backends.methods import METHOD_IDS, MethodSpec, spec_from_options
from gateway.policy.classes import CLASS_PATTERN, MAX_CLASSES
from gateway.policy.rules import MAX_RULES, feature_test
from gateway.urls import check_backend_url

SPECULATIVE_OPTIONS_DEPTH = 8  # vLLM's speculative_config is flat but for a few small maps


def nested_deeper(payload: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether any object or array sits deeper than `limit` (`payload` itself is 1)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(payload, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def _shallow(options: dict[str, Any]) -> dict[str, Any]:
    if nested_deeper(options, SPECULATIVE_OPTIONS_DEPTH):
        raise ValueError(f"speculative_options nest more than {SPECULATIVE_OPTIONS_DEPTH} deep")
    return options


SpeculativeOptions = Annotated[dict[str, Any], AfterValidator(_shallow)]
# A backend's vLLM `--api-key`: one printable token (it goes into an Authorization header).
BackendKey = Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^[!-~]+$")]
# Printable: a key's name goes into tables and logs, where CR/LF could forge lines.
ClassName = Annotated[str, Field(pattern=CLASS_PATTERN)]
# No C0 or C1 control characters, nor the bidirectional ones that reorder what a table or a
# log line shows (a name can look like another's).
KeyName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]+$",
    ),
]
SpeculativeK = Annotated[int, Field(ge=0, le=64)]  # num_speculative_tokens; 0 for plain

Name = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"),
]
BackendName = Annotated[
    str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
]
GpuType = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][\w.-]*$")]
Method = Literal[
    "plain", "eagle3", "p-eagle", "dflash", "dspark", "ngram", "suffix", "mtp", "draft_model"
]
PriceKind = Literal["on-demand", "reserved", "spot"]
assert set(METHOD_IDS) == set(get_args(Method)), "Method literal out of step with the catalog"


class Strict(BaseModel):
    """Refuse unknown keys, so a typo is an error rather than silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Public(BaseModel):
    """Read from ORM rows."""

    model_config = ConfigDict(from_attributes=True)


Scheduling = Literal["fcfs", "priority"]  # vLLM's --scheduling-policy


class Decoding(Strict):
    """How a backend decodes and what it runs on: every field a backend and a pool's members
    share (a member has its own address)."""

    model: Name
    method: Method
    k: SpeculativeK | None = None
    drafter: str | None = Field(default=None, max_length=500)
    speculative_options: SpeculativeOptions = Field(default_factory=dict)
    gpu_type: GpuType = "B200"
    gpu_count: int = Field(default=1, ge=1, le=1024)
    api_key: BackendKey | None = Field(default=None, repr=False)
    scheduling: Scheduling = Field(
        default="fcfs",
        description=(
            "Its server's `--scheduling-policy`: with `priority`, each request is sent with "
            "vLLM's `priority` (its class's or team's, 0 without), the gateway's alone."
        ),
    )

    def method_spec(self) -> MethodSpec:
        """The validated method spec (raises `InvalidMethodSpec`)."""
        return spec_from_options(self.method, self.k, self.drafter, self.speculative_options)

    @model_validator(mode="after")
    def _check_method(self) -> Self:
        self.method_spec()  # InvalidMethodSpec is a ValueError naming the field at fault
        return self


class BackendFields(Decoding):
    """A backend but its name: how it decodes, where it serves, whether it takes traffic."""

    url: AnyHttpUrl
    enabled: bool = True
    managed: bool = False

    def normalised_url(self) -> str:
        """The base URL as stored: no trailing slash, no `/v1`."""
        return check_backend_url(self.url)

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: AnyHttpUrl) -> AnyHttpUrl:
        check_backend_url(url)
        return url


class BackendCreate(BackendFields):
    """A new backend."""

    name: BackendName


class PoolTemplate(Decoding):
    """What every member of a pool is, but its address."""


class DnsDiscovery(Strict):
    """A DNS name whose A/AAAA records are a pool's members (a headless Service's ready
    pods), each serving on `port`."""

    dns: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$",
    )
    port: int = Field(default=8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"


KUBE_NAME = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"  # a DNS-1123 label: a Service or namespace


class KubernetesDiscovery(Strict):
    """A Service whose EndpointSlices, listed and watched through the Kubernetes API, hold a
    pool's members: each ready endpoint's address, serving on `port` (the pod's port). A
    terminating or unready pod leaves the pool at once."""

    service: str = Field(min_length=1, max_length=63, pattern=KUBE_NAME)
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=KUBE_NAME,
        description="Default: the gateway's own namespace (its service account's).",
    )
    port: int = Field(default=8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"


Discovery = DnsDiscovery | KubernetesDiscovery


class PoolFields(Strict):
    """A pool but its name: where its members are found, and what each is."""

    discovery: Discovery
    backend: PoolTemplate


POOL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
PoolName = Annotated[str, Field(min_length=1, max_length=100, pattern=POOL_NAME)]


class PoolCreate(PoolFields):
    """A pool: its members are found by `discovery` and made backends from `backend`."""

    name: PoolName

    def member(self, address: str) -> BackendCreate:
        """The backend serving at `address` (an IPv4 or IPv6 address)."""
        port, host = self.discovery.port, f"[{address}]" if ":" in address else address
        return BackendCreate.model_validate(
            {
                **self.backend.model_dump(),
                "name": f"{self.name}:{address}:{port}",
                "url": f"{self.discovery.scheme}://{host}:{port}",
            }
        )


class BackendUpdate(Strict):
    """A partial change to a backend; absent keys are left as they are."""

    url: AnyHttpUrl | None = None
    model: Name | None = None
    method: Method | None = None
    k: SpeculativeK | None = None
    drafter: str | None = Field(default=None, max_length=500)
    speculative_options: SpeculativeOptions | None = None
    gpu_type: GpuType | None = None
    gpu_count: int | None = Field(default=None, ge=1, le=1024)
    enabled: bool | None = None
    managed: bool | None = None
    api_key: BackendKey | None = Field(default=None, repr=False)  # null: no key any more
    scheduling: Scheduling | None = None


class BackendSwitch(Strict):
    """Move a managed backend to another method or K: a new server replaces the old one."""

    method: Method
    k: SpeculativeK | None = None
    drafter: str | None = Field(default=None, max_length=500)
    speculative_options: SpeculativeOptions = Field(default_factory=dict)
    name: BackendName | None = None  # the new backend's name; default: derived from the old


class SwitchAccepted(Public):
    """A switch under way; its steps appear in the audit log of the old backend."""

    old_name: str
    new_name: str
    method: str
    k: int | None
    status: Literal["starting"] = "starting"


class BackendRuntime(BaseModel):
    """What this gateway replica sees of a backend right now (never stored or audited)."""

    healthy: bool
    circuit_open: bool
    in_flight: int  # this replica's requests on it
    waiting: float  # the backend's own queue, from its last scrape
    kv_cache_usage: float
    # The context length its /v1/models reports (None: not probed yet; 0: it reports none).
    max_model_len: int | None = None
    # The engine version its /version reports (None: not read yet, or it serves none): read
    # at its first scrape and after each restart; an upgrade is audited (actor `collector`)
    engine_version: str | None = None
    method_mismatch: str | None  # its counters contradict its declared method
    # How its requests are priced: by the throughput curve of its (model, method, GPU); with
    # none (a model the planner has no spec for, before any measurement), by their share of
    # its GPU time ("gpu_time", +-100%, no saving claimed); "unpriced" when its GPU has no
    # price, so its requests cost nothing in any $ figure.
    pricing: Literal["curve", "gpu_time", "unpriced"] = "curve"
    # Live acceptance: the last scrape interval in which it drafted ("scrape"), else its
    # latest stored measurement at its method and K ("measurement"); None for plain or
    # before any data.
    acceptance_length: float | None = None
    acceptance_per_position: list[float] | None = None
    acceptance_source: Literal["scrape", "measurement"] | None = None


class BackendPublic(Public):
    """A backend as the API shows it, with the vLLM speculative config it implies."""

    name: str
    url: str
    model: str
    method: str
    k: int | None
    drafter: str | None
    speculative_options: dict[str, Any]
    speculative_config: dict[str, Any] | None = None
    gpu_type: str
    gpu_count: int
    scheduling: str
    enabled: bool
    managed: bool
    has_api_key: bool = False  # the key itself is write-only
    pool: str | None = None  # the pool whose discovery added it
    created_at: dt.datetime
    updated_at: dt.datetime
    runtime: BackendRuntime | None = None  # on reads, for enabled backends this replica knows


class PoolTemplatePublic(Public):
    """A pool's member fields as the API shows them: the backend key write-only."""

    model: str
    method: str
    k: int | None
    drafter: str | None
    speculative_options: dict[str, Any]
    gpu_type: str
    gpu_count: int
    scheduling: str = "fcfs"
    has_api_key: bool


class PoolPublic(Public):
    """A pool, its members (backend names) and why its last resolution failed, if it did."""

    name: str
    discovery: Discovery
    backend: PoolTemplatePublic
    members: list[str]
    discovery_error: str | None


class PolicyRule(Strict):
    """Requests with every feature in `when` go to `method` (at `k`, if given); the
    vocabulary is in gateway/policy/rules.py and docs/fleet.md."""

    when: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        min_length=1, max_length=8
    )
    method: Method
    k: int | None = Field(default=None, ge=1, le=64)

    @field_validator("when")
    @classmethod
    def _known_features(cls, features: list[str]) -> list[str]:
        for feature in features:
            feature_test(feature)  # ValueError names the vocabulary
        return features

    @model_validator(mode="after")
    def _plain_takes_no_k(self) -> Self:
        if self.method == "plain" and self.k is not None:
            raise ValueError(f"method 'plain' takes no k, got k={self.k}")
        return self


class ClassObjective(Strict):
    """What `auto` optimises for one request class (gateway/policy/classes.py): the lowest $/1M
    within an ITL ceiling (`cost`), or the lowest ITL within a cost ceiling (`latency`)."""

    objective: Literal["cost", "latency"] = "cost"
    itl_objective_ms: float | None = Field(default=None, gt=0)
    max_usd_per_mtok: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ceiling_fits_the_objective(self) -> Self:
        if self.objective == "cost" and self.max_usd_per_mtok is not None:
            raise ValueError("objective 'cost' takes itl_objective_ms, not max_usd_per_mtok")
        if self.objective == "latency" and self.itl_objective_ms is not None:
            raise ValueError("objective 'latency' takes max_usd_per_mtok, not itl_objective_ms")
        return self


class DrafterTrial(Strict):
    """An A/B of two drafters of one method (gateway/policy/trials.py): `share` of the
    method's requests go to its backends running `drafter`, the rest to its other backends;
    `GET /admin/v1/savings?group_by=drafter` reports the two side by side."""

    drafter: str = Field(min_length=1, max_length=500)
    share: float = Field(gt=0.0, lt=1.0)


class Policy(Strict):
    """How a model's traffic picks a method: pinned to one, or the planner's choice by load;
    `rules` first send requests with given features to a method of their own; under `auto`,
    `classes` give request classes objectives of their own; `drafter_trial` splits a
    method's requests between two of its drafters."""

    mode: Literal["auto", "pinned"] = "auto"
    method: Method | None = None
    k: int | None = Field(default=None, ge=1, le=64)
    itl_objective_ms: float | None = Field(default=None, gt=0)
    explore_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    rules: list[PolicyRule] = Field(default_factory=list, max_length=MAX_RULES)
    classes: dict[ClassName, ClassObjective] = Field(default_factory=dict, max_length=MAX_CLASSES)
    drafter_trial: DrafterTrial | None = None
    # The lossless watchdog takes a method whose greedy answers diverge out of `auto`'s
    # choices (docs/lossless.md); a pinned method or a rule's is never overridden
    lossless_quarantine: bool = False

    @model_validator(mode="after")
    def _pinned_names_method(self) -> Self:
        if self.mode == "pinned" and self.method is None:
            raise ValueError("a pinned policy needs a method (mode='pinned', method=None)")
        if self.k is not None and self.method is None:
            raise ValueError(f"k={self.k} needs a method to apply to")
        if self.method == "plain" and self.k is not None:
            raise ValueError(f"method 'plain' takes no k, got k={self.k}")
        return self


class ModelCreate(Strict):
    """A new model, with its policy (default: auto)."""

    name: Name
    policy: Policy = Field(default_factory=Policy)


class MovePublic(BaseModel):
    """A gradual move of a pinned model's traffic to its method, under way: the target's
    share is `min(1, step_share x (1 + floor((now - started_at) / step_s)))`."""

    source: str  # the method the traffic is leaving
    target: str  # the pinned method
    started_at: dt.datetime
    step_share: float
    step_s: float
    target_share: float  # the target's share now
    ends_at: dt.datetime  # when the target takes everything


class ModelPublic(BaseModel):
    """A model and its policy."""

    name: str
    policy: Policy
    move: MovePublic | None = None  # a gradual move to the pinned method, while under way
    created_at: dt.datetime
    updated_at: dt.datetime


class PolicySaved(ModelPublic):
    """A model after its policy was set, with what in the policy no backend serves."""

    warnings: list[str] = Field(default_factory=list)


class PriceFields(Strict):
    """What one GPU-hour costs, and where that figure came from."""

    usd_per_gpu_hour: float = Field(ge=0, le=1000)
    source: str = Field(min_length=1, max_length=500)
    date: dt.date


class PriceCreate(PriceFields):
    """A new GPU price."""

    gpu_type: GpuType
    kind: PriceKind = "on-demand"


class PriceUpdate(Strict):
    """A partial change to a GPU price."""

    usd_per_gpu_hour: float | None = Field(default=None, ge=0, le=1000)
    source: str | None = Field(default=None, min_length=1, max_length=500)
    date: dt.date | None = None


class PricePublic(Public):
    """A GPU price as the API shows it."""

    id: int
    gpu_type: str
    usd_per_gpu_hour: float
    kind: str
    source: str
    date: dt.date


class KeyLimits(Strict):
    """Limits of one API key; None means unlimited."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent_requests: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Requests in flight at once, per replica."
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=1024,
        le=2**31 - 1,
        description=(
            "Largest request body this key may send (413 beyond, before the body is read); "
            "the gateway's DRAFTGATE_MAX_BODY_BYTES bounds it too. Null: the gateway's alone."
        ),
    )
    budget_usd: float | None = Field(default=None, ge=0)
    budget_period: Literal["daily", "monthly", "total"] = "monthly"
    allowed_models: list[Name] | None = None
    request_class: ClassName | None = Field(
        default=None, description="The class of its requests without an x-draftgate-class."
    )
    lossless_opt_out: bool = Field(
        default=False,
        description="Its requests are never replayed by the lossless watchdog (docs/lossless.md).",
    )
    team_id: int | None = Field(
        default=None,
        description=(
            "The team it belongs to (GET /admin/v1/teams): its usage is attributed to it, and "
            "the team's allowed models bound its own. Null: none."
        ),
    )


class KeyCreate(KeyLimits):
    """A new API key."""

    name: KeyName


class KeyUpdate(Strict):
    """A partial change to an API key's name or limits."""

    name: KeyName | None = None
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent_requests: int | None = Field(default=None, ge=1, le=1_000_000)
    max_body_bytes: int | None = Field(default=None, ge=1024, le=2**31 - 1)
    budget_usd: float | None = Field(default=None, ge=0)
    budget_period: Literal["daily", "monthly", "total"] | None = None
    allowed_models: list[Name] | None = None
    request_class: ClassName | None = None
    lossless_opt_out: bool | None = None
    team_id: int | None = None


class KeyPublic(Public):
    """An API key as the API shows it: never the key, only its prefix."""

    id: int
    name: str
    key_prefix: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    max_body_bytes: int | None = None
    budget_usd: float | None
    budget_period: str
    allowed_models: list[str] | None
    request_class: str | None = None
    lossless_opt_out: bool = False
    team_id: int | None = None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class KeyCreated(KeyPublic):
    """A key just created: the only response that carries the secret."""

    key: str


class AuditPublic(Public):
    """One audit log entry."""

    id: int
    at: dt.datetime
    actor: str
    action: str
    resource_type: str
    resource_id: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


ItemT = TypeVar("ItemT", bound=BaseModel)


class QuarantinePublic(Public):
    """A method the lossless watchdog took out of a model's `auto` choices (docs/lossless.md),
    with the evidence it saw: checks, divergences, the rate and its 95% interval, the
    threshold, the reference method and the model's floor over the same checks. Active
    until `lifted_at`."""

    id: int
    model: str
    method: str
    since: dt.datetime
    evidence: dict[str, Any]
    lifted_at: dt.datetime | None
    lifted_by: str | None


class ListOf(BaseModel, Generic[ItemT]):
    """A list in OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[ItemT]


class GpuDefaultPrice(BaseModel):
    """A price shipped with the catalog (the database's prices override it)."""

    kind: PriceKind
    usd_per_gpu_hour: float
    source: str
    date: dt.date


class GpuPublic(BaseModel):
    """One GPU type of the planner's catalog."""

    name: str
    aliases: list[str]
    memory_gb: float
    hbm_bandwidth_tb_s: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    fp4_dense_tflops: float | None
    estimated: bool  # some datasheet figures are estimates
    source: str
    default_prices: list[GpuDefaultPrice]


class MeasurementPublic(Public):
    """One stored performance point (from the collector, a sweep or an import)."""

    id: int
    model: str
    method: str
    k: int
    gpu_type: str
    gpu_count: int
    concurrency: float
    output_tokens_per_s: float
    mean_acceptance_length: float | None
    acceptance_per_position: list[float] | None
    ttft_ms: float | None
    itl_ms: float | None
    source: str
    backend_name: str | None
    measured_at: dt.datetime
    requests: int | None  # the requests it rests on (None: the source did not say)
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None


class TokenScope(BaseModel):
    """What the token a request carries may do: `read` (every GET, and the routes marked
    `x-draftgate-scope: read`) or `admin` (everything)."""

    scope: Literal["read", "admin"]
    actor: str  # its changes' name in the audit log: the token's, or `<person> via <token>`
