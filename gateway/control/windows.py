"""A collector window: what one backend's scrapes add up to over a window, and the gate it
must pass to become a measurement (enough requests and tokens, something in flight, a rate
the hardware can deliver)."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.vllm_metrics import Observation
from gateway.db.tables import Measurement
from gateway.registry import BackendView, InFlightClock
from planner.ceiling import ceiling_exceeded

# The backend finished more requests than this replica sent it (beyond what a scrape
# boundary shifts between windows): it has other clients.
FOREIGN_RATIO = 1.1
FOREIGN_SLACK = 2


@dataclass(frozen=True)
class Gate:
    """The least a collector window must hold to become a measurement."""

    min_requests: int
    min_output_tokens: int
    # A window above the hardware's ceiling times this is not stored (None: never checked).
    ceiling_margin: float | None = None

    def above_ceiling(self, m: Measurement) -> bool:
        """Whether `m` is faster than its hardware can be, margin included."""
        return above_ceiling(m, self.ceiling_margin)


def above_ceiling(m: Measurement, margin: float | None) -> bool:
    """Whether `m` is faster than its model can run on its GPUs, `margin` times over (never
    for a model or GPU the planner's catalog does not know, nor without a margin)."""
    if margin is None:
        return False
    acceptance = m.mean_acceptance_length or (1 + m.k if m.method != "plain" else 1.0)
    rate, c = m.output_tokens_per_s, m.concurrency
    args = (m.model, m.gpu_type, m.gpu_count, c, acceptance, rate, margin)
    return ceiling_exceeded(*args) is not None


@dataclass
class Tally:
    """Observations of one backend, summed over a window: the backend's counters, and what
    this replica's gateway sent it (its in-flight clock) over the same scrapes."""

    seconds: float = 0.0
    output_tokens: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)
    finished: float | None = 0.0  # requests the backend finished (None: it does not say)
    prompt_tokens: float = 0.0
    sent: InFlightClock = field(default_factory=InFlightClock)
    gauge_in_flight_s: float = 0.0  # Σ running + waiting at each scrape, times its interval
    gauge_busy_s: float = 0.0  # Σ intervals that ended with a request running or waiting
    own_sampled_s: float = 0.0  # Σ this replica's requests on it at each scrape, times alike
    # What served the window: a drafter or engine change starts a new window.
    drafter: str | None = None
    engine_version: str | None = None

    def add(self, o: Observation, sent: InFlightClock, in_flight_now: float = 0.0) -> None:
        """Add one scrape interval: the backend's counters, what this replica sent it over
        the interval, and what it had in flight on it at the scrape."""
        self.seconds += o.seconds
        self.output_tokens += o.output_tokens
        self.prompt_tokens += o.prompt_tokens
        self.finished = (
            None if o.finished is None or self.finished is None else (self.finished + o.finished)
        )
        self.drafts += o.drafts
        self.accepted += o.accepted
        self.sent = InFlightClock(
            self.sent.in_flight_s + sent.in_flight_s,
            self.sent.busy_s + sent.busy_s,
            self.sent.ended + sent.ended,
        )
        self.gauge_in_flight_s += o.running * o.seconds
        self.gauge_busy_s += o.seconds if o.running > 0 else 0.0
        self.own_sampled_s += in_flight_now * o.seconds
        grow = len(o.accepted_per_position) - len(self.accepted_per_position)
        self.accepted_per_position += [0.0] * max(0, grow)
        for i, value in enumerate(o.accepted_per_position):
            self.accepted_per_position[i] += value

    def foreign(self) -> bool:
        """Whether the backend finished requests this replica did not send it (other
        replicas' or other clients'): then the gateway's clock misses some of its load."""
        if self.finished is None:
            return True
        return self.finished > FOREIGN_RATIO * self.sent.ended + FOREIGN_SLACK

    def in_flight(self) -> tuple[float, float]:
        """The window's request-seconds in flight and busy seconds at the backend.

        The gateway's clock is exact for what it sent. When the backend also served others,
        their share is estimated from the backend's gauges (an instant per scrape): the
        gauges less this replica's own requests at the same instants, so that only the
        others' part is sampled; its busy time is the larger of the two. Another's traffic
        can only raise the concurrency a rate is stored at, never lower it.
        """
        in_flight_s, busy_s = self.sent.in_flight_s, self.sent.busy_s
        if self.foreign():
            in_flight_s += max(0.0, self.gauge_in_flight_s - self.own_sampled_s)
            busy_s = max(busy_s, self.gauge_busy_s)
        busy_s = min(busy_s, self.seconds)
        return max(in_flight_s, busy_s), busy_s

    def rejection(self, gate: Gate) -> str | None:
        """Why the window is too thin to be a measurement, if it is."""
        if self.finished is not None and self.finished < gate.min_requests:
            return "too_few_requests"
        if self.output_tokens < gate.min_output_tokens:
            return "too_few_tokens"
        if self.in_flight()[1] <= 0:
            return "nothing_in_flight"
        return None

    def measurement(self, backend: BackendView) -> Measurement:
        """The window as one `scrape` measurement: the output tokens generated in it over the
        time the backend had requests in flight, at their time-average over that time.

        A request that spans windows counts in each the tokens and the time it spent there.
        When the backend was busy all the window this is its tokens over the window at its
        mean requests in flight; when it sat idle part of it, the rate while it was busy
        (an idle backend generates nothing) at the requests in flight while busy (at least
        one). Only time measured in flight divides the tokens, never a figure derived from
        the requests that finished.
        """
        spec = self.drafts > 0
        in_flight_s, busy_s = self.in_flight()
        return Measurement(
            model=backend.model,
            method=backend.method,
            k=backend.k or 0,
            gpu_type=backend.gpu_type,
            gpu_count=backend.gpu_count,
            concurrency=in_flight_s / busy_s,
            output_tokens_per_s=self.output_tokens / busy_s,
            mean_acceptance_length=1 + self.accepted / self.drafts if spec else None,
            acceptance_per_position=[a / self.drafts for a in self.accepted_per_position]
            if spec
            else None,
            source="scrape",
            backend_name=backend.name,
            drafter=self.drafter,
            engine_version=self.engine_version,
            requests=None if self.finished is None else round(self.finished),
            mean_prompt_tokens=self.prompt_tokens / self.finished if self.finished else None,
            mean_output_tokens=self.output_tokens / self.finished if self.finished else None,
        )
