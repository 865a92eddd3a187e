"""``legionpy compare-traces SIM REAL``: a simulated and a real timeline,
device by device (issue 9 item 5).

    legionpy simulate lenet --scale small --machine local:2 --trace sim.json
    LEGIONPY_CPUS=2 LEGIONPY_TRACE=real.json legionpy train lenet --steps 1
    legionpy compare-traces sim.json real.json --png both.png

Both files are Chrome trace / Perfetto JSON, in their two dialects:

- the simulator's (:func:`legionpy.optimizer.trace.chrome_trace`): one
  ``pid`` per device or link, named by ``process_name`` metadata after the
  machine model: ``cpu0``, ``gpu3``, ``n0gpu1`` and links ``cpu0->cpu1``;
- the runtime's (:meth:`legionpy.runtime.trace.Trace.to_chrome`): ``pid`` =
  MPI rank, one ``tid`` per queue named ``device 3`` or ``link mem0->mem1``
  (``host`` for host memory), and the record (``device``, ``link``) under
  ``args``.

Each row is normalised to ``dev N`` or ``link A->B`` (N, A, B global device
ids, or ``host``): ``cpuN``/``gpuN`` is device N; ``nKgpuJ`` names are
numbered in order of their first appearance. Times are shifted so each trace
starts at 0. The real trace should hold one iteration (trace a one-step run,
or pass ``--window START_MS:END_MS`` to cut one out of a longer trace).

Prints busy seconds per row, simulated vs real, both makespans, and where
the iteration goes per device and kind -- compute, copy/collective (copies
arriving over the device's links), update, fill/reduce and idle
(:mod:`legionpy.optimizer.breakdown`; the real trace's figures divided by
the iterations it covers) -- with the largest miss named; with ``--json``
one object ``{"sim_makespan_s", "real_makespan_s", "relative_error",
"rows": {row: {"sim_busy_s", "real_busy_s"}}, "terms": {"sim": {row:
{term: s}}, "real": ...}, "worst_term": {"row", "term", "sim_s", "real_s",
"diff_s"}}``. ``--png``
draws each row twice, simulated above real, on one time axis (matplotlib,
Agg).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from ..cli import command
from .args import in_file, out_file

__all__ = ["load_timeline", "compare", "plot_timelines"]

_DEV = re.compile(r"^(?:device |dev |cpu|gpu)(\d+)$")
_NODE_DEV = re.compile(r"^n(\d+)(?:cpu|gpu)(\d+)$")


def _mem(s: str, names: dict[str, str]) -> str:
    s = s.strip()
    if s.startswith("mem") and s[3:].isdigit():
        return s[3:]
    if s.startswith("host"):
        return "host"
    return _norm(s, names).removeprefix("dev ")


def _norm(name: str, names: dict[str, str]) -> str:
    """``dev N`` / ``link A->B`` for a row name of either dialect."""
    name = str(name).strip()
    if name in names:
        return names[name]
    body = name.removeprefix("link ").strip()
    if "->" in body:
        a, b = body.split("->", 1)
        return f"link {_mem(a, names)}->{_mem(b, names)}"
    m = _DEV.match(name)
    if m:
        return f"dev {int(m.group(1))}"
    if _NODE_DEV.match(name):
        key = f"dev {sum(v.startswith('dev ') for v in names.values())}"
        names[name] = key
        return key
    return name


def load_timeline(path_or_obj: Any, window: tuple[float, float] | None = None) -> list[dict]:
    """Tasks ``{"row", "name", "kind", "start_s", "end_s"}`` of a Chrome trace
    (either dialect; see the module docstring), shifted to start at 0;
    ``window`` (seconds, after the shift) keeps the tasks starting inside it."""
    if isinstance(path_or_obj, (str, bytes)) or hasattr(path_or_obj, "__fspath__"):
        with open(path_or_obj) as f:
            try:
                obj = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                from ..errors import LegionpyError
                raise LegionpyError(f"{os.fspath(path_or_obj)!r} is not a JSON trace ({e}); "
                                    "pass a file written by `legionpy simulate --trace` or "
                                    "LEGIONPY_TRACE") from None
    else:
        obj = path_or_obj
    if isinstance(obj, dict) and "traceEvents" not in obj:
        from ..errors import LegionpyError
        raise LegionpyError(f"{path_or_obj!r} has no traceEvents: not a Chrome trace")
    events = obj["traceEvents"] if isinstance(obj, dict) else obj
    pname: dict[Any, str] = {}
    tname: dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e.get("tid", 0))] = e["args"]["name"]
    names: dict[str, str] = {}
    tasks = []
    for e in events:
        if e.get("ph") != "X":
            continue
        a = e.get("args") or {}
        if a.get("link") is not None:
            src, dst = a["link"]
            row = "link " + "->".join("host" if int(m) < 0 else str(int(m)) for m in (src, dst))
        elif isinstance(a.get("device"), str):  # a collective's communicator, comm:0,1
            row = a["device"]
        elif a.get("device") is not None:
            row = f"dev {int(a['device'])}"
        else:
            raw = tname.get((e["pid"], e.get("tid", 0))) or pname.get(e["pid"], str(e["pid"]))
            row = _norm(raw, names)
        if row in ("untimed", "device None"):
            continue
        start = float(e["ts"]) * 1e-6
        tasks.append({"row": row, "name": e.get("name", ""),
                      "kind": e.get("cat", a.get("kind", "task")),
                      "start_s": start, "end_s": start + float(e.get("dur", 0.0)) * 1e-6})
    if tasks:
        t0 = min(t["start_s"] for t in tasks)
        for t in tasks:
            t["start_s"] -= t0
            t["end_s"] -= t0
    if window is not None:
        lo, hi = window
        tasks = [t for t in tasks if lo <= t["start_s"] < hi]
        if tasks:
            t0 = min(t["start_s"] for t in tasks)
            for t in tasks:
                t["start_s"] -= t0
                t["end_s"] -= t0
    return tasks


def _busy(tasks: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in tasks:
        out[t["row"]] = out.get(t["row"], 0.0) + t["end_s"] - t["start_s"]
    return out


def _row_order(row: str) -> tuple:
    kind, _, rest = row.partition(" ")
    nums = [int(x) if x.isdigit() else -1 for x in re.split(r"->", rest)]
    return (kind != "dev", nums, row)


def compare(sim: list[dict], real: list[dict]) -> dict:
    """Makespans and per-row busy seconds of two timelines."""
    bs, br = _busy(sim), _busy(real)
    ms = max((t["end_s"] for t in sim), default=0.0)
    mr = max((t["end_s"] for t in real), default=0.0)
    rows = sorted(set(bs) | set(br), key=_row_order)
    return {"sim_makespan_s": ms, "real_makespan_s": mr,
            "relative_error": (ms - mr) / mr if mr > 0 else None,
            "rows": {r: {"sim_busy_s": bs.get(r, 0.0), "real_busy_s": br.get(r, 0.0)}
                     for r in rows}}


_TASK = re.compile(r"^([FBU])(?::|\()([^\[\)]+)")


def iterations(sim: list[dict], real: list[dict]) -> float | None:
    """How many iterations ``real`` covers per iteration of ``sim``: the
    median over the compute tasks both name (``F:conv1[0]`` / ``F(conv1)``)
    of real count / simulated count; None when they share no task."""
    def counts(tasks: list[dict]) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for t in tasks:
            m = _TASK.match(t["name"])
            if m and t["kind"] == "compute":
                k = (m.group(1), m.group(2))
                out[k] = out.get(k, 0) + 1
        return out

    cs, cr = counts(sim), counts(real)
    ratios = sorted(cr[k] / cs[k] for k in cs.keys() & cr.keys())
    return ratios[len(ratios) // 2] if ratios else None


def plot_timelines(sim: list[dict], real: list[dict], path: str,
                   labels: tuple[str, str] = ("sim", "real")) -> None:
    """PNG: one band per row (device or link), its simulated tasks above its
    real ones, coloured by kind, on a shared time axis in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sorted({t["row"] for t in sim} | {t["row"] for t in real}, key=_row_order)
    colours = {"compute": "tab:blue", "update": "tab:green", "copy": "tab:orange",
               "fill": "tab:gray", "load": "tab:purple"}
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.55 * len(rows) + 1.2)))
    yticks, ylabels = [], []
    for i, row in enumerate(rows):
        for lane, (tasks, label) in enumerate(zip((sim, real), labels)):
            y = i * 2.6 + lane * 1.1
            bars = [(t["start_s"] * 1e3, max((t["end_s"] - t["start_s"]) * 1e3, 1e-4))
                    for t in tasks if t["row"] == row]
            cols = [colours.get(t["kind"], "tab:red") for t in tasks if t["row"] == row]
            if bars:
                ax.broken_barh(bars, (y, 0.9), facecolors=cols, edgecolor="none",
                               alpha=0.9 if lane == 0 else 0.6)
            yticks.append(y + 0.45)
            ylabels.append(f"{row} {label}")
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ms = max((t["end_s"] for t in sim), default=0.0) * 1e3
    mr = max((t["end_s"] for t in real), default=0.0) * 1e3
    ax.set_title(f"{labels[0]} (makespan {ms:.3f} ms) above {labels[1]} "
                 f"(makespan {mr:.3f} ms), per device and link", fontsize=9)
    used = sorted({t["kind"] for t in sim + real})
    ax.legend([Patch(color=colours.get(k, "tab:red")) for k in used], used, fontsize=7,
              loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _configure(p) -> None:
    p.add_argument("sim", type=in_file, help="simulated trace (legionpy simulate --trace FILE)")
    p.add_argument("real", type=in_file, help="real trace (LEGIONPY_TRACE=FILE)")
    p.add_argument("--png", type=out_file, metavar="FILE", help="draw both timelines per device")
    p.add_argument("--window", type=_window, metavar="START_MS:END_MS",
                   help="keep the real tasks starting in this window (one iteration)")


def _window(spec: str) -> tuple[float, float]:
    """``START_MS:END_MS`` -> (start, end) seconds (an argparse type)."""
    import argparse

    try:
        a, b = (float(x) * 1e-3 for x in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not START_MS:END_MS, e.g. 120:180"
                                         ) from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"{spec!r}: the window needs 0 <= START_MS < END_MS")
    return a, b


@command("compare-traces", "compare a simulated and a real trace per device (--png draws both)")
def _compare_traces(args) -> dict:
    sim = load_timeline(args.sim)
    real = load_timeline(args.real, args.window)
    out = compare(sim, real)
    its = iterations(sim, real)
    out["real_iterations"] = its
    warn = None
    if its is not None and round(its) != 1:
        warn = (f"warning: the real trace covers {its:g} iterations and the simulated one 1, so "
                "the makespans are not comparable: pass --window START_MS:END_MS to keep one "
                "iteration of the real trace")
        print(f"legionpy compare-traces: {warn}", file=sys.stderr)
        out["warning"] = warn
    if args.png:
        plot_timelines(sim, real, args.png)
        out["png"] = args.png
    # where the time goes, per device and kind (the real side per simulated iteration)
    from ..optimizer.breakdown import breakdown, format_breakdown, worst_term

    n_real = max(1, round(its)) if its else 1
    out["terms"] = {"sim": breakdown(sim), "real": breakdown(real, iterations=n_real)}
    out["worst_term"] = worst_term(out["terms"]["sim"], out["terms"]["real"])
    err = out["relative_error"]
    lines = [f"makespan: simulated {out['sim_makespan_s'] * 1e3:.3f} ms, real "
             f"{out['real_makespan_s'] * 1e3:.3f} ms"
             + ("" if err is None else f" (simulated {err * 100:+.1f}%)"),
             f"  {'row':<20} {'sim busy ms':>12} {'real busy ms':>13}"]
    for row, v in out["rows"].items():
        lines.append(f"  {row:<20} {v['sim_busy_s'] * 1e3:>12.3f} {v['real_busy_s'] * 1e3:>13.3f}")
    lines.append("where an iteration goes, per device and kind (ms):")
    lines.append(format_breakdown(out["terms"]["sim"], out["terms"]["real"]))
    if args.png:
        lines.append(f"  wrote {args.png}")
    return {"text": "\n".join(lines), **out}


_compare_traces.configure = _configure
