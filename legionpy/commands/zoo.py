"""``legionpy models`` and ``legionpy machines``: what can be searched, on what."""

from __future__ import annotations

from ..cli import command
from .args import positive_int


@command("models", "list the model zoo with operator and parameter counts")
def _models(args) -> dict:
    from ..models import MODELS

    rows = []
    for name, make in MODELS.items():
        graph = make().graph
        rows.append({"name": name, "ops": len(graph.ops),
                     "parameters": int(graph.num_parameters()),
                     "batch_size": graph.batch_size})
    lines = [f"{'model':<14}{'ops':>6}{'parameters':>16}{'batch':>7}"]
    lines += [f"{r['name']:<14}{r['ops']:>6}{r['parameters']:>16,}{r['batch_size']:>7}"
              for r in rows]
    return {"text": "\n".join(lines), "models": rows}


def _configure_machines(p) -> None:
    p.add_argument("--nodes", type=positive_int, default=None,
                   help="describe each preset with this many nodes (default: its own)")


@command("machines", "list machine presets (SPEC forms for --machine) and the local machine")
def _machines(args) -> dict:
    from ..optimizer import Machine
    from ..optimizer.machine import PRESETS
    from ..optimizer.recorded_profiles import preset_profile, profiles_dir

    rows = []
    for name in sorted(PRESETS):
        if name == "local":
            continue
        m = Machine.preset(name, nodes=args.nodes or 1)
        row = _describe(m, f"{name}:NODESxGPUS" if name != "dgx1" else "dgx1")
        prof = preset_profile(name, include_refused=True)
        row["cost_model"] = prof.describe() if prof is not None else {
            "kind": "analytic", "files": [], "models": [], "devices": [], "refused": []}
        rows.append(row)
    local = Machine.local()
    rows.append({**_describe(local, "local"),
                 "cost_model": {"kind": "analytic (--cost measured: this machine's kernels)",
                                "files": [], "models": [], "devices": [],
                                "refused": []}})
    lines = [f"{'spec':<18}{'devices':>8}{'links':>7}{'nodes':>7}  device  (peak FLOP/s)  costs"]
    for r in rows:
        lines.append(f"{r['spec']:<18}{r['devices']:>8}{r['links']:>7}{r['nodes']:>7}  "
                     f"{r['device_kind']}  ({r['peak_flops']:.3g})  {_costs_text(r)}")
        for bad in r["cost_model"]["refused"]:
            lines.append(f"{'':<18}  refused {bad['file']}: {bad['why']}")
    folder = profiles_dir()
    lines.append("a JSON file written by Machine.save() is a SPEC too")
    lines.append(f"profiles: {folder if folder is not None else 'off (LEGIONPY_PROFILES=off)'}"
                 " (PRESET-MODEL.json; `legionpy profile --zoo --out DIR` records them)")
    return {"text": "\n".join(lines), "machines": rows,
            "profiles_dir": str(folder) if folder is not None else None}


_machines.configure = _configure_machines


def _costs_text(row: dict) -> str:
    """``analytic`` or ``profile FILES (GPU; models)``: what a preset's
    default cost model is."""
    cm = row["cost_model"]
    if cm["kind"] != "profile":
        return cm["kind"]
    files = ", ".join(f["file"] for f in cm["files"])
    return f"profile {files} ({', '.join(cm['devices'])}; {', '.join(cm['models'])})"


def _describe(m, spec: str) -> dict:
    d0 = m.devices[0]
    return {"spec": spec, "name": m.name, "devices": m.num_devices, "links": m.num_links,
            "nodes": m.num_nodes, "device_kind": d0.kind, "peak_flops": d0.flops,
            "memory_bytes": d0.memory}
