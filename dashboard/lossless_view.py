"""The lossless watchdog's checks as people read them: every divergence rate beside the floor
(a method against itself), since the engine's floating-point sums differ between batches even
without speculation."""

from __future__ import annotations

from dashboard.formats import NO_DATA, or_missing, share, usd
from dashboard.schemas import FirstDivergence, LosslessGroup, LosslessModel, LosslessReplays

NAMED = 3  # diverged configurations the sentence names; the table lists them all
UNITS = {"token": "tokens", "char": "characters", "mixed": "tokens or characters"}
OFF_NOTE = (
    "No lossless checks of this model in the period: the watchdog is off "
    "(`DRAFTGATE_LOSSLESS_SAMPLE_SHARE` is 0 unless set) or has not compared an answer yet. "
    "Set `DRAFTGATE_LOSSLESS_SAMPLE_SHARE` on the gateway (e.g. 0.01) to replay that share of "
    "greedy requests on the model's reference method and compare the answers "
    "(docs/lossless.md)."
)
READING_NOTE = (
    "Each served answer's configuration against its replay on the reference method. A rate "
    "near the floor is the engine's own noise; well above it, on one method, drafter, backend "
    "or engine version, is a finding. Divergences early, or at one position, fit a broken "
    "verify path; late in long answers, numerical noise."
)


def percent(rate: float, interval_95: tuple[float, float]) -> str:
    """A rate with its 95% interval: `30.00% (95%: 18.06% to 45.33%)`."""
    low, high = interval_95
    return f"{share(rate)} (95%: {share(low)} to {share(high)})"


def _label(group: LosslessGroup, groups: list[LosslessGroup]) -> str:
    """The method and K, and the backend and engine only where another group shares them."""
    label = group.method if group.k is None else f"{group.method} K={group.k}"
    twins = [g for g in groups if g is not group and (g.method, g.k) == (group.method, group.k)]
    if twins:
        label += f" on {group.backend}"
    if any(g.backend == group.backend for g in twins):
        label += f" (engine {or_missing(group.engine_version)})"
    return label


def floor_text(found: LosslessModel) -> str:
    """The model's floor, `the floor (plain against plain) is 2 of 50 (4.00% ...)`."""
    references = sorted({g.reference_method for g in found.groups})
    against = " and ".join(f"{r} against {r}" for r in references)
    floor = found.floor
    if floor.divergence_rate is None or floor.interval_95 is None:
        return f"no floor yet ({against}: none checked), so no rate can be told from noise"
    rate = percent(floor.divergence_rate, floor.interval_95)
    return f"the floor ({against}) is {floor.divergences:,} of {floor.samples:,} ({rate})"


def summary(found: LosslessModel) -> str:
    """One sentence: how many answers were checked, which configurations changed any, and the
    floor beside them."""
    checked = sum(g.samples for g in found.groups)
    references = " and ".join(sorted({g.reference_method for g in found.groups}))
    head = f"{checked:,} answers checked against {references}"
    changed = sorted(
        (g for g in found.groups if not g.is_floor and g.divergences),
        key=lambda g: -g.divergence_rate,
    )
    if not changed:
        return f"{head}: no method changed an answer; {floor_text(found)}."
    named = [
        f"{_label(g, found.groups)} changed {g.divergences:,} of {g.samples:,} greedy answers "
        f"({percent(g.divergence_rate, g.interval_95)})"
        for g in changed[:NAMED]
    ]
    if len(changed) > NAMED:
        named.append(f"{len(changed) - NAMED} more configuration(s) in the table")
    return f"{head}: {'; '.join(named)}; {floor_text(found)}."


def first_divergence(first: FirstDivergence | None) -> str:
    """Where diverged answers first differ: `median 5 tokens (5 to 9)`."""
    if first is None:
        return NO_DATA
    unit = UNITS.get(first.unit, first.unit)
    return f"median {first.p50:g} {unit} ({first.min:,} to {first.max:,})"


def group_rows(groups: list[LosslessGroup]) -> list[dict[str, object]]:
    """The groups as table rows, the floor first as the API orders them."""
    return [
        {
            "method": g.method,
            "K": or_missing(g.k),
            "drafter": or_missing(g.drafter),
            "backend": g.backend,
            "engine version": or_missing(g.engine_version),
            "against": f"{g.reference_method} (the floor)" if g.is_floor else g.reference_method,
            "checks": g.samples,
            "divergences": g.divergences,
            "by token ids": g.by_tokens,
            "rate (95% interval)": percent(g.divergence_rate, g.interval_95),
            "first divergence": first_divergence(g.first_divergence),
            "last seen": f"{g.last_seen:%Y-%m-%d %H:%M} UTC",
        }
        for g in groups
    ]


def replays_note(replays: LosslessReplays) -> str:
    """What the replays cost: `4 replays, $0.0060 (a capacity cost, priced like any request)`."""
    noun = "replay" if replays.requests == 1 else "replays"
    note = (
        f"{replays.requests:,} {noun}, {usd(replays.cost_usd)} "
        "(a capacity cost, priced like any request)"
    )
    if replays.unpriced:
        note += f"; {replays.unpriced:,} without a price, not in it"
    return note
