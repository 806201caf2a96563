"""Request and response shapes of benchmark runs: a sweep against a backend, its progress."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from backends.bench import DEFAULT_REQUESTS_PER_CLIENT, DEFAULT_REQUESTS_PER_LEVEL
from backends.workloads import WorkloadName, resolve_lengths
from gateway.schemas.resources import Public, Strict

Level = Annotated[int, Field(ge=1, le=1024)]


class InvalidBenchmark(ValueError):
    """A combination of benchmark fields that makes no sense; names the field at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class BenchmarkCreate(Strict):
    """A sweep against one registered backend, closed-loop or at a request rate."""

    backend: str
    concurrency: list[Level] = Field(default_factory=lambda: [1, 4, 16], min_length=1)
    requests_per_level: int | None = Field(default=None, ge=1, le=100_000)
    # At least this many requests per client at each level (with neither count nor duration
    # given: 50 per level and 8 per client, so c=64 runs 512 requests at 64 in flight)
    requests_per_client: int | None = Field(default=None, ge=1, le=10_000)
    duration_s: float | None = Field(default=None, gt=0, le=3600)
    rate_per_s: float | None = Field(default=None, gt=0, le=10_000)
    poisson: bool = False
    burstiness: float | None = Field(default=None, gt=0, le=1000)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    workload: WorkloadName = "synthetic"
    input_len: int | None = Field(default=None, ge=1, le=32_768)
    output_len: int | None = Field(default=None, ge=1, le=32_768)
    temperature: float | None = Field(default=None, ge=0, le=2)  # None: the server's default

    @model_validator(mode="after")
    def _one_budget(self) -> BenchmarkCreate:
        if self.requests_per_level is None and self.duration_s is None:
            self.requests_per_level = DEFAULT_REQUESTS_PER_LEVEL
            if self.requests_per_client is None:
                self.requests_per_client = DEFAULT_REQUESTS_PER_CLIENT
        if self.requests_per_client is not None and self.requests_per_level is None:
            raise InvalidBenchmark(
                "requests_per_client raises a request count: give requests_per_level",
                "requests_per_client",
            )
        return self

    @model_validator(mode="after")
    def _arrivals(self) -> BenchmarkCreate:
        if self.poisson and self.rate_per_s is None:
            raise InvalidBenchmark("poisson shapes open-loop arrivals: give rate_per_s", "poisson")
        if self.burstiness is not None and not self.poisson:
            raise InvalidBenchmark(
                "burstiness is the gamma shape of poisson arrivals: set poisson", "burstiness"
            )
        if self.poisson and self.burstiness is None:
            self.burstiness = 1.0
        return self

    @model_validator(mode="after")
    def _lengths(self) -> BenchmarkCreate:
        """Store the mean lengths the run uses: the preset's unless given."""
        self.input_len, self.output_len = resolve_lengths(
            self.workload, self.input_len, self.output_len
        )
        return self


class BenchmarkPublic(Public):
    """A run as the API shows it."""

    id: int
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    model: str
    url: str
    backend_name: str | None
    params: dict[str, Any]
    progress: float
    error: str | None
    result: dict[str, Any] | None
