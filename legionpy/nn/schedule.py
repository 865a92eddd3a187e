"""The order a replayed training step runs in: the optimizer's schedule.

DESIGN.md invariant 3 asks that every device and link run its tasks in the
simulated order. A traced step (runtime/tracing.py) replays each queue's ops
in a fixed order; :func:`simulated_order` gives the tracer that order from
the simulator: the recorded ops are named as the mirror names them
(``F:op[k]``, ``B:op[k]``, ``U:param[t]``, copies by the task they feed),
and each queue's ops are sorted by the simulated start of their name. Ops
the simulator does not have (host transfers) sort with the first simulated
op that waits for them. The tracer checks the order against the recorded
dependences and falls back to the recorded order if it would deadlock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["simulated_order"]


def simulated_order(graph: Any, strategy: Any, machine: Any, cost_model: Any = None,
                    sync: str | None = None) -> Callable[[list[dict]], dict]:
    """``order(records) -> {queue: [record ids]}`` for ``lp.trace(order=...)``,
    from a simulation of ``strategy`` on ``machine`` (made on first use)."""

    def order(records: list[dict]) -> dict:
        from ..optimizer.mirror import simulated_starts, trace_labels
        from ..optimizer.simulator import Simulator

        sim = Simulator(graph, machine, cost_model, sync=sync)
        sim.run(strategy)
        starts = simulated_starts(sim.tg)
        labels = trace_labels(records)
        key: dict[int, float] = {}
        for r in records:
            lab = labels.get(r["id"])
            if lab is not None and lab in starts:
                key[r["id"]] = starts[lab]
        succ: dict[int, list[int]] = {}
        for r in records:
            for d in r["deps"]:
                succ.setdefault(d, []).append(r["id"])
        out: dict[Any, list] = {}
        for r in sorted(records, key=lambda r: r["id"]):
            q = r["device"] if r["link"] is None else tuple(r["link"])
            if q is None:
                continue
            k = key.get(r["id"])
            if k is None:  # not simulated: with its first simulated successor
                k = min((key[s] for s in succ.get(r["id"], ()) if s in key),
                        default=float("inf"))
            out.setdefault(q, []).append((k, r["id"]))
        return {q: [i for _, i in sorted(v)] for q, v in out.items()}

    return order
