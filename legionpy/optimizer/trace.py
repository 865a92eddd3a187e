"""Timeline and strategy pictures.

:func:`chrome_trace` turns a list of executed or simulated tasks into a
Chrome trace / Perfetto JSON object (load it at ui.perfetto.dev or
chrome://tracing). Both halves use it: the simulator passes
:meth:`Simulator.tasks`, the runtime passes what it traced. A task is a dict
with ``name``, ``device`` (a compute device or link name), ``start_s``,
``end_s`` and optionally ``id``, ``kind``, ``bytes``. Each device becomes a
process (``pid``) with one thread (``tid``), both named by the device, so
links and GPUs appear as separate rows; ``ts``/``dur`` are microseconds.

:func:`plot_strategy` draws a strategy as in the paper's Figures 13-14: one
row per operator, its tiles as cells coloured by device.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

__all__ = ["chrome_trace", "write_chrome_trace", "plot_strategy"]


def chrome_trace(tasks: Iterable[dict]) -> dict:
    """``{"traceEvents": [...], "displayTimeUnit": "ms"}`` with one complete
    ("X") event per task and metadata naming each device row."""
    events, pids = [], {}
    for t in tasks:
        dev = str(t["device"])
        if dev not in pids:
            pids[dev] = len(pids)
            events.append({"ph": "M", "name": "process_name", "pid": pids[dev], "tid": 0,
                           "args": {"name": dev}})
            events.append({"ph": "M", "name": "thread_name", "pid": pids[dev], "tid": 0,
                           "args": {"name": dev}})
        args = {k: t[k] for k in ("id", "kind", "bytes") if k in t}
        events.append({"ph": "X", "name": t["name"], "cat": t.get("kind", "task"),
                       "pid": pids[dev], "tid": 0, "ts": float(t["start_s"]) * 1e6,
                       "dur": (float(t["end_s"]) - float(t["start_s"])) * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(tasks: Iterable[dict], path: str) -> None:
    """Write :func:`chrome_trace` of ``tasks`` to ``path`` (atomically)."""
    from .strategy import atomic_write_json
    atomic_write_json(path, chrome_trace(tasks))


def plot_strategy(graph, strategy, machine, path: str, max_ops: int = 200) -> None:
    """PNG of ``strategy``: a row per op (first ``max_ops``), its tiles as
    equal cells coloured by device id."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    ops = graph.ops[:max_ops]
    n_dev = machine.num_devices
    cmap = plt.get_cmap("tab20" if n_dev <= 20 else "viridis", max(n_dev, 2))
    fig, ax = plt.subplots(figsize=(8, max(2.0, 0.18 * len(ops) + 1)))
    for row, op in enumerate(ops):
        cfg = strategy[op.name]
        w = 1.0 / cfg.num_tiles
        for k, dev in enumerate(cfg.devices):
            ax.add_patch(Rectangle((k * w, row), w, 0.9, color=cmap(dev % cmap.N),
                                   ec="white", lw=0.3))
        ax.text(-0.01, row + 0.45, f"{op.name} {cfg.degrees}", ha="right", va="center",
                fontsize=6)
    ax.set_xlim(0, 1)
    ax.set_ylim(len(ops), 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{graph.name} on {machine.name}: tiles coloured by device", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, color=cmap(d % cmap.N)) for d in range(min(n_dev, 16))]
    ax.legend(handles, [machine.devices[d].name for d in range(min(n_dev, 16))],
              fontsize=5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_trace(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
