"""The Overview's verdict: one sentence made of the figures on the page, the action they
lead to (release GPUs, set an objective, move), and the bill split into its parts to the
cent."""

from __future__ import annotations

import streamlit as st

from dashboard.formats import money, usd_interval
from dashboard.schemas import Backend, Fleet, FleetMethod


def held_and_wanted(fleet: Fleet, backends: list[Backend]) -> tuple[dict[str, int], dict[str, int]]:
    """GPUs each method pool holds now, and GPUs each wants for the load now."""
    mine = [b for b in backends if b.model == fleet.model and b.enabled]
    held = {m: sum(b.gpu_count for b in mine if b.method == m) for m in {b.method for b in mine}}
    per_replica = {m.method: m.gpu_count for m in fleet.methods}
    desired = fleet.now.desired_replicas if fleet.now is not None else {}
    return held, {m: n * per_replica.get(m, 1) for m, n in desired.items()}


def verdict(fleet: Fleet, backends: list[Backend], label: str) -> None:
    """One sentence from the figures below it, and the action they lead to."""
    by_method = {m.method: m for m in fleet.methods}
    best = by_method.get(fleet.best) if fleet.best else None
    said = (
        f"You paid {money(fleet.actual.spend_usd)} for {fleet.actual.gpu_hours:,.2f} "
        f"GPU-hours ({label})"
    )
    if best is None:
        said += "; no method meets the latency objective on this traffic"
    else:
        said += f"; sized for its traffic, {best.method} would have cost {money(best.bill_usd)}"
    saving, saving_95 = fleet.achievable_savings_usd, fleet.achievable_savings_usd_95
    if best is not None and best.method != "plain" and saving is not None and saving > 0:
        said += f", {money(saving)} less than plain ({usd_interval(saving_95)}"
        said += ": not significant, the interval includes zero)" if _spans_zero(saving_95) else ")"
    elif fleet.objective.itl_ms is None:
        pays = fleet.objective.speculation_pays_below_itl_ms
        said += ". Without a latency objective plain needs the fewest GPUs"
        if pays is not None:
            said += f"; at {pays:.1f} ms per token or less speculative decoding costs less"
    else:
        said += f". Within {fleet.objective.itl_ms:g} ms per token plain is as cheap"
    st.markdown(f"**{said}.**")
    st.info(_action(fleet, backends, best))


def _spans_zero(interval: tuple[float, float] | None) -> bool:
    return interval is not None and interval[0] <= 0 <= interval[1]


def _action(fleet: Fleet, backends: list[Backend], best: FleetMethod | None) -> str:
    """What to do now: release GPUs, set an objective, move, or nothing."""
    held, wanted = held_and_wanted(fleet, backends)
    routed = fleet.now.routed_method if fleet.now is not None else None
    idle = sorted(m for m in held if m != routed and held[m] and m in wanted)
    release = sum(held.values()) - sum(wanted.values())
    per_hour = (
        fleet.actual.spend_usd / fleet.actual.gpu_hours
        if fleet.actual.spend_usd is not None and fleet.actual.gpu_hours
        else None
    )
    if release > 0:
        needed, holding = sum(wanted.values()), sum(held.values())
        return f"Release {release} GPU(s) now: the load needs {needed} of the {holding} held."
    if idle:
        gpus = sum(held[m] for m in idle)
        cost = f", about {money(gpus * per_hour)} per hour at the bill's price" if per_hour else ""
        return (
            f"Release the idle pools {', '.join(idle)}: {gpus} GPU(s){cost}. No traffic is "
            f"routed to them; each keeps {fleet.idle_pool_replicas} replica(s) only because "
            "DRAFTGATE_IDLE_POOL_REPLICAS says so (0 lets the autoscaler release them, at the "
            "cost of a cold start when the policy moves there)."
        )
    if fleet.objective.itl_ms is None and fleet.objective.speculation_pays_below_itl_ms:
        return "Set a latency objective on Methods (try one first in the what-if above)."
    if best is not None and routed is not None and routed != best.method:
        return f"Move to {best.method}: its right-sized bill is the lowest within the objective."
    return "Nothing to do now: the fleet holds what its load needs."


def reconciled(fleet: Fleet) -> str:
    """The bill as the sum of the figures beside it, to the cent."""
    by_method = {m.method: m for m in fleet.methods}
    best = by_method.get(fleet.best) if fleet.best else None
    bill, served, over = fleet.actual.spend_usd, fleet.served_bill_usd, fleet.over_provisioning_usd
    if bill is None or served is None or over is None or best is None or best.bill_usd is None:
        return "The bill cannot be split here: a method served has no price or no curve."
    # Round the parts, not only the sum: the printed figures must add up to the printed bill,
    # so the last part takes whatever cent the rounding of the others left over.
    bill, served, right_sized = round(bill, 2), round(served, 2), round(best.bill_usd, 2)
    mix, over = round(served - right_sized, 2), round(bill - served, 2)
    return (
        f"Bill {money(bill)} = right-sized bill of {best.method} {money(right_sized)} "
        f"+ methods as served above it {money(mix)} (each pool that served in an hour counts "
        f"whole replicas for it) + over-provisioning {money(over)} (GPUs held beyond that)."
    )
