"""Take a calibration's lock fit again, offline, on the rows it measured
(issue 26): which terms the fit chose, how well each alternative explains
the calibration's own rows, and, given a fidelity bench's JSON, how each
predicts the bench's measured steps.

A calibration writes its rows, their task graphs and its overhead before the
lock fit when ``LEGIONPY_CALIBRATION_ROWS`` names a file::

    LEGIONPY_CACHE=/tmp/c LEGIONPY_CALIBRATION_ROWS=/tmp/rows.pkl \\
        python bench/fidelity.py --recalibrate --regime overhead --json /tmp/b.json ...
    LEGIONPY_CACHE=/tmp/c python bench/refit_locks.py /tmp/rows.pkl --bench /tmp/b.json \\
        --set gil_switch=1.0 --set gil_kernel_s=1e-4

Run it as the bench ran (under ``mpirun -n 2`` for a bench taken with
``--ranks 2``), with the bench's cache (its kernel timings and lock shares).
Each ``--set`` holds terms at given values; the row ``fit`` is the fit taken
again (it should repeat the calibration's), ``cached`` the terms the
calibration kept. Search rows are skipped (their strategy is not in the JSON).
``--landscape`` adds a row per value of the lock fit's ``gil_kernel_s``
grid: the best fit with that value (the rest descended), its loss and its
bench errors -- how far apart fits of near-equal loss predict (on one
calibration's rows of 28 Nov, fits within 6% of the best loss put the
bench's mean error anywhere from 6.0 to 10.5%). ``--drop NAME`` leaves out
the rows of the calibration models whose name holds NAME: what the fit
would take without them (``--drop h48``, the LSTM of the zoo's cell size:
on R34's rows, 28 Nov, 75 us then came within 4% of the best loss, 30 us,
where with them it is 4-38% behind).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import legionpy as lp  # noqa: E402
from legionpy.measure import runtime_overhead  # noqa: E402
from legionpy.measure.calibration import (  # noqa: E402
    calibration_models,
    fit_lock_terms_on_ranks,
    lock_fit_candidates,
)
from legionpy.optimizer import Machine  # noqa: E402
from legionpy.optimizer.fidelity import RuntimeOverhead  # noqa: E402
from legionpy.runtime.mpi import share_among_ranks  # noqa: E402

LOCK_TERMS = ("gil_kernel_s", "gil_switch", "wake_s", "copy_s", "hop_s", "one_core_scale",
              "poll_share")


def _variant(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        k, v = part.split("=")
        out[k.strip()] = float(v)
    return out


def _without(rows: list, graphs: list, drop: list[str]) -> tuple[list, list]:
    """The rows (and their task graphs) of the calibration models whose name
    holds none of ``drop``.

    >>> _without([{"model": "calib_mlp2"}, {"model": "calib_lstm4x2h48"}], ["g0", "g1"],
    ...          ["h48"])
    ([{'model': 'calib_mlp2'}], ['g0'])
    """
    keep = [i for i, r in enumerate(rows) if not any(d in r["model"] for d in drop)]
    return [rows[i] for i in keep], [graphs[i] for i in keep]


def _bench_errors(ovh: RuntimeOverhead, results: list[dict], machine: Machine) -> list[float]:
    from legionpy import models as zoo
    from legionpy.mapper.resolve import resolve_strategy
    from legionpy.measure.fidelity import predict_model
    from legionpy.models.training import default_optimizer

    errs = []
    for r in results:
        if r["strategy"] == "search":
            continue
        m = zoo.build(r["model"], scale="small", seed=0)
        m.compile(optimizer=default_optimizer(r["model"]),
                  loss="sparse_categorical_crossentropy",
                  strategy=resolve_strategy(r["strategy"], m.graph, machine), machine=machine)
        p = predict_model(m, machine=machine, overhead=ovh)["iteration_time_s"]
        errs.append(p / r["measured_time_s"] - 1.0)
    return errs


def _landscape(base: RuntimeOverhead, rows: list, graphs: list,
               fit_copy: bool) -> dict[str, dict]:
    """``{"gil_kernel_s=V": the best fit with that value}`` over the lock
    fit's grid (its values shared among the ranks). Collective."""
    parts = share_among_ranks(lambda rank, size: lock_fit_candidates(
        base, rows, graphs, fit_copy=fit_copy, part=(rank, size)))
    fits = sorted((f for part in parts for f in part), key=lambda f: f["order"])
    return {f"gil_kernel_s={f['gil_kernel_s']:.3g}": {k: v for k, v in f.items() if k != "order"}
            for f in fits}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", help="the file LEGIONPY_CALIBRATION_ROWS named")
    p.add_argument("--bench", help="bench/fidelity.py --json output of the same session")
    p.add_argument("--set", action="append", default=[], metavar="TERM=V[,TERM=V]",
                   help="terms held at these values (a row of the table each)")
    p.add_argument("--base", action="append", default=[], metavar="FIELD=V[,FIELD=V]",
                   help="overhead figures set before the fit (e.g. poll_share=0.22: a "
                   "figure a calibration of older code did not measure)")
    p.add_argument("--landscape", action="store_true",
                   help="a row per gil_kernel_s of the fit's grid: the best fit with it")
    p.add_argument("--drop", action="append", default=[], metavar="NAME",
                   help="leave out the rows of the calibration models whose name holds "
                   "NAME (e.g. h48: what the fit takes without that model)")
    args = p.parse_args()
    rt = lp.init()
    root = rt.rank == 0
    machine = Machine.local()
    with open(args.rows, "rb") as f:
        dump = pickle.load(f)
    fields = RuntimeOverhead.__dataclass_fields__
    base = RuntimeOverhead(**{k: v for k, v in dump["overhead"].items() if k in fields})
    held = {k: v for text in args.base for k, v in _variant(text).items()}
    base = replace(base, **held)
    by_name = {m.graph.name: m.graph for m in calibration_models()}
    graphs = [(tg, by_name[n]) for tg, n in zip(dump["taskgraphs"], dump["models"])]
    rows, graphs = _without(dump["rows"], graphs, args.drop)
    cached = replace(runtime_overhead(machine), **held)
    variants = {"cached": {k: getattr(cached, k) for k in LOCK_TERMS + ("task_s",)}}
    fit = fit_lock_terms_on_ranks(base, rows, graphs, fit_copy=dump["fit_copy"])
    variants["fit"] = fit
    for text in args.set:
        v = _variant(text)
        variants[text] = v
    if args.landscape:
        variants.update(_landscape(base, rows, graphs, dump["fit_copy"]))
    results = json.load(open(args.bench))["overhead"]["results"] if args.bench else []
    for name, terms in variants.items():
        o = replace(cached, **{k: v for k, v in terms.items() if k in fields})
        desc = " ".join(f"{k} {getattr(o, k):.3g}" for k in LOCK_TERMS)
        line = f"{name:<28} {desc}"
        if "loss" in terms:
            line += f" loss {terms['loss']:.4f}"
        if results:
            e = _bench_errors(o, results, machine)
            line += (f" | bench mean {statistics.mean(abs(x) for x in e) * 100:5.1f}% "
                     f"worst {max(abs(x) for x in e) * 100:5.1f}% "
                     f"signed {statistics.mean(e) * 100:+5.1f}%  "
                     + " ".join(f"{x * 100:+.0f}" for x in e))
        if root:
            print(line, flush=True)
    lp.runtime.shutdown()


if __name__ == "__main__":
    main()
