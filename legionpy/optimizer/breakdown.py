"""Where an iteration's time goes, per device and per kind of work (issue 26).

A simulated and a measured timeline are each cut into the same terms, per
device, so a prediction that misses names the term that misses:

``compute``
    forward and backward tasks on the device (``F``/``B``);
``copy``
    copies arriving at the device over its links (``link A->N``) and
    collective operations on it (gradient exchange);
``update``
    optimizer updates on the device (``U``);
``fill``
    fills and reductions the runtime runs as their own records (the
    simulator has none: a measured fill/reduce term is work it leaves out);
``control``
    the control thread's seconds per iteration (one row, ``control``):
    simulated :func:`~legionpy.optimizer.fidelity.simulate_with_runtime`'s
    ``control_busy_s``, measured the calling thread's CPU time per step;
``idle``
    the iteration's period less the device's busy time (compute, update,
    fill and collectives: copies run on links, beside it).

Two more terms, where the figures exist, say how a device's worker thread
spent its time rather than on what (they are not added to the others):

``wait``
    seconds its tasks waited, inside their spans, for a core or the
    interpreter lock: simulated, the processor sharing's stretch of them
    (:mod:`.sharing`); measured, their wall time less their bodies' CPU
    time (:meth:`legionpy.runtime.core.Runtime.worker_span_cpu`);
``between``
    the worker's CPU seconds between its tasks (finishing one, releasing
    its successors, taking the next from its queue): simulated, the
    ``finish_s`` the model charges per task; measured, the worker thread's
    CPU time less its tasks' bodies'.

This is the accounting Legion Prof and FlexFlow's simulator-vs-real plots
use (Bauer et al., SC 2012; Jia et al., MLSys 2019, section 8.3): per
processor, busy time by task kind plus the utility (control) processor.

A timeline is a list of ``{"row", "kind", "name", "start_s", "end_s"}``
(:func:`legionpy.commands.compare_traces.load_timeline`'s form), rows
``dev N``, ``link A->B`` (``host`` for host memory), ``comm:0-3,8`` (a
collective over those devices: its time counts in each member's ``copy``)
or anything else (kept out of the per-device terms).

>>> tl = [{"row": "dev 0", "kind": "compute", "name": "F:a[0]", "start_s": 0.0, "end_s": 0.002},
...       {"row": "link 1->0", "kind": "copy", "name": "X", "start_s": 0.002, "end_s": 0.003},
...       {"row": "dev 0", "kind": "update", "name": "U:w[0]", "start_s": 0.003, "end_s": 0.004}]
>>> b = breakdown(tl, period_s=0.005)
>>> {k: round(v * 1e3, 3) for k, v in b["dev 0"].items()}
{'compute': 2.0, 'copy': 1.0, 'update': 1.0, 'fill': 0.0, 'idle': 2.0}
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["TERMS", "LABELS", "term_of", "breakdown", "sim_timeline", "breakdown_rows",
           "format_breakdown", "worst_term"]

#: the terms, in print order
TERMS = ("compute", "copy", "update", "fill", "control", "idle", "wait", "between")
LABELS = {"compute": "compute", "copy": "copy/collective", "update": "update",
          "fill": "fill/reduce", "control": "control thread", "idle": "idle",
          "wait": "lock/core wait", "between": "between tasks"}
_DEVICE_TERMS = ("compute", "copy", "update", "fill", "idle")


def term_of(kind: str, name: str = "") -> str:
    """The term of a task of ``kind`` (a trace record's or the simulator's) named ``name``."""
    kind = (kind or "").lower()
    if kind in ("copy", "collective", "load") or name.startswith(("RS:", "AG:", "X:")):
        return "copy"
    if kind == "update" or name.startswith("U:") or name.startswith("U("):
        return "update"
    if kind in ("fill", "reduce", "fold"):
        return "fill"
    return "compute"


_LINK = re.compile(r"^link (\S+)->(\S+)$")


def breakdown(tasks: list[dict], period_s: float | None = None, control_s: float | None = None,
              iterations: float = 1.0) -> dict[str, dict[str, float]]:
    """Seconds per iteration of every term (module doc) per ``dev N`` row of
    ``tasks``, plus a ``control`` row ``{"control": control_s}`` when given.
    ``period_s``: the span the tasks cover (default: their makespan);
    ``iterations``: how many iterations that span holds (every figure is
    divided by it)."""
    span = period_s if period_s is not None else max((t["end_s"] for t in tasks), default=0.0)
    out: dict[str, dict[str, float]] = {}

    def row(name: str) -> dict[str, float]:
        return out.setdefault(name, {k: 0.0 for k in _DEVICE_TERMS})

    on_device: dict[str, float] = {}
    for t in tasks:
        d = max(0.0, t["end_s"] - t["start_s"])
        r = t["row"]
        m = _LINK.match(r)
        if m is not None:  # a copy arriving at device N
            dst = m.group(2)
            if dst != "host":
                row(f"dev {dst}")["copy"] += d
            continue
        if r.startswith("comm:"):  # a collective: every member's exchange
            for dev in _members(r):
                row(f"dev {dev}")["copy"] += d
            continue
        if not r.startswith("dev "):
            continue
        term = term_of(t.get("kind", ""), t.get("name", ""))
        row(r)[term] += d
        on_device[r] = on_device.get(r, 0.0) + d
    for r, v in out.items():
        v["idle"] = max(0.0, span - on_device.get(r, 0.0))
    n = max(iterations, 1e-12)
    out = {r: {k: x / n for k, x in v.items()} for r, v in sorted(out.items(), key=_order)}
    if control_s is not None:
        out["control"] = {"control": float(control_s)}
    return out


def _members(comm: str) -> list[int]:
    """Device ids of a communicator row ``comm:0-3,8`` (runs ``a-b``)."""
    out: list[int] = []
    for part in comm.removeprefix("comm:").split(","):
        a, _, b = part.partition("-")
        if a.strip().isdigit():
            out.extend(range(int(a), int(b) + 1) if b.strip().isdigit() else [int(a)])
    return out


def _order(item: tuple[str, Any]) -> tuple:
    r = item[0]
    num = r.split(" ", 1)[-1]
    return (0, int(num)) if num.isdigit() else (1, r)


def sim_timeline(taskgraph: dict, start: list[float], end: list[float],
                 device_rows: dict[str, str]) -> list[dict]:
    """A timeline (module doc) of a scheduled simulator task graph: task i ran
    ``start[i]..end[i]`` on its ``device`` (a device or link name, mapped by
    ``device_rows`` name -> ``dev N``; links ``A->B`` from their ends)."""
    out = []
    for t in taskgraph["tasks"]:
        res = str(t["device"])
        if res in device_rows:
            row = device_rows[res]
        elif "->" in res:
            a, b = res.split("->", 1)
            row = ("link " + device_rows.get(a, a).removeprefix("dev ") + "->"
                   + device_rows.get(b, b).removeprefix("dev "))
        else:
            row = res
        out.append({"row": row, "kind": t["kind"], "name": t["name"],
                    "start_s": start[t["id"]], "end_s": end[t["id"]]})
    return out


def breakdown_rows(sim: dict, real: dict) -> list[dict]:
    """``{"row", "term", "sim_s", "real_s", "diff_s"}`` for every (row, term)
    of two breakdowns, in print order."""
    rows = []
    for r in sorted(set(sim) | set(real), key=lambda r: _order((r, None))):
        terms = [k for k in TERMS if k in sim.get(r, {}) or k in real.get(r, {})]
        for k in terms:
            s, m = sim.get(r, {}).get(k, 0.0), real.get(r, {}).get(k, 0.0)
            rows.append({"row": r, "term": k, "sim_s": s, "real_s": m, "diff_s": s - m})
    return rows


def worst_term(sim: dict, real: dict) -> dict | None:
    """The (row, term) whose simulated seconds miss the measured ones most
    (idle left out: it is what the other terms leave), or None."""
    rows = [r for r in breakdown_rows(sim, real) if r["term"] != "idle"]
    return max(rows, key=lambda r: abs(r["diff_s"]), default=None)


def format_breakdown(sim: dict, real: dict, labels: tuple[str, str] = ("sim", "real")) -> str:
    """The breakdown as a table, ms per iteration, one line per (row, term)."""
    lines = [f"  {'row':<9} {'term':<16} {labels[0] + ' ms':>9} {labels[1] + ' ms':>9} "
             f"{'sim-real':>9}"]
    for r in breakdown_rows(sim, real):
        lines.append(f"  {r['row']:<9} {LABELS[r['term']]:<16} {r['sim_s'] * 1e3:>9.3f} "
                     f"{r['real_s'] * 1e3:>9.3f} {r['diff_s'] * 1e3:>+9.3f}")
    w = worst_term(sim, real)
    if w is not None:
        lines.append(f"  largest miss: {LABELS[w['term']]} on {w['row']} "
                     f"({w['diff_s'] * 1e3:+.3f} ms per iteration)")
    return "\n".join(lines)
