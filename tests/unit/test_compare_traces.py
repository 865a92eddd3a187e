"""`legionpy compare-traces`: both Chrome-trace dialects, busy times, the PNG."""

from __future__ import annotations

import json

import pytest

from legionpy.cli import main
from legionpy.commands.compare_traces import compare, load_timeline
from legionpy.optimizer.trace import chrome_trace


def _sim():
    return chrome_trace([
        {"name": "F0", "device": "cpu0", "start_s": 0.0, "end_s": 0.002, "kind": "compute"},
        {"name": "F1", "device": "cpu1", "start_s": 0.0, "end_s": 0.001, "kind": "compute"},
        {"name": "X", "device": "cpu1->cpu0", "start_s": 0.001, "end_s": 0.0015, "kind": "copy"},
        {"name": "B0", "device": "cpu0", "start_s": 0.002, "end_s": 0.003, "kind": "compute"},
    ])


def _real():
    """The runtime's dialect: pid = rank, named tids, the record under args."""
    ev = []
    for i, (dev, link, s, e, kind) in enumerate([
            (0, None, 10.0, 10.0025, "compute"), (1, None, 10.0, 10.0012, "compute"),
            (None, [1, 0], 10.0012, 10.0020, "copy"), (0, None, 10.003, 10.004, "compute"),
            (None, [-1, 0], 10.0, 10.0001, "copy")]):
        ev.append({"name": f"t{i}", "cat": kind, "ph": "X", "ts": s * 1e6, "dur": (e - s) * 1e6,
                   "pid": 0, "tid": i, "args": {"device": dev, "link": link, "kind": kind}})
    ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "device 0"}})
    return {"traceEvents": ev}


def test_rows_are_normalised_in_both_dialects():
    sim, real = load_timeline(_sim()), load_timeline(_real())
    assert {t["row"] for t in sim} == {"dev 0", "dev 1", "link 1->0"}
    assert {t["row"] for t in real} == {"dev 0", "dev 1", "link 1->0", "link host->0"}
    assert min(t["start_s"] for t in real) == 0.0  # shifted to start at 0
    r = compare(sim, real)
    assert abs(r["sim_makespan_s"] - 0.003) < 1e-12 and abs(r["real_makespan_s"] - 0.004) < 1e-9
    assert abs(r["rows"]["dev 0"]["sim_busy_s"] - 0.003) < 1e-12
    assert abs(r["rows"]["dev 0"]["real_busy_s"] - 0.0035) < 1e-9
    assert r["rows"]["link host->0"]["sim_busy_s"] == 0.0


def test_node_gpu_names_and_window():
    tr = chrome_trace([{"name": "a", "device": "n0gpu0", "start_s": 0, "end_s": 1},
                       {"name": "b", "device": "n0gpu1", "start_s": 0, "end_s": 1},
                       {"name": "c", "device": "n0gpu0->n0gpu1", "start_s": 1, "end_s": 2}])
    assert {t["row"] for t in load_timeline(tr)} == {"dev 0", "dev 1", "link 0->1"}
    cut = load_timeline(_real(), window=(0.0029, 0.01))
    assert [t["name"] for t in cut] == ["t3"] and cut[0]["start_s"] == 0.0


def test_command_png_and_json(tmp_path, capsys):
    s, r = tmp_path / "sim.json", tmp_path / "real.json"
    s.write_text(json.dumps(_sim()))
    r.write_text(json.dumps(_real()))
    png = tmp_path / "out.png"
    assert main(["compare-traces", str(s), str(r), "--png", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 1000 and out["png"] == str(png)
    assert set(out["rows"]) >= {"dev 0", "dev 1"} and out["relative_error"] < 0
    assert main(["compare-traces", str(s), str(r)]) == 0
    assert "makespan" in capsys.readouterr().out


def test_warns_when_the_real_trace_covers_several_iterations(tmp_path, capsys):
    from legionpy.cli import main

    def ev(name, ts, pid=0, tid=0):
        return {"name": name, "cat": "compute", "ph": "X", "ts": ts, "dur": 10, "pid": pid,
                "tid": tid, "args": {"device": 0}}

    sim = {"traceEvents": [ev("F:fc[0]", 0), ev("B:fc[0]", 10)]}
    real = {"traceEvents": [ev("F(fc)", 100 * i) for i in range(3)]
            + [ev("B(fc)", 100 * i + 20) for i in range(3)]}
    (tmp_path / "s.json").write_text(json.dumps(sim))
    (tmp_path / "r.json").write_text(json.dumps(real))
    assert main(["compare-traces", str(tmp_path / "s.json"), str(tmp_path / "r.json"),
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["real_iterations"] == 3
    assert "covers 3 iterations" in err and "--window" in err
    assert main(["compare-traces", str(tmp_path / "s.json"), str(tmp_path / "r.json"),
                 "--window", "0:0.05"]) == 0
    assert "warning" not in capsys.readouterr().err


# -- where the time goes, per device and kind (issue 26) --------------------------------------

def test_breakdown_per_device_and_kind_by_hand(tmp_path, capsys):
    s, r = tmp_path / "sim.json", tmp_path / "real.json"
    s.write_text(json.dumps(_sim()))
    r.write_text(json.dumps(_real()))
    assert main(["compare-traces", str(s), str(r), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sim, real = out["terms"]["sim"], out["terms"]["real"]
    ms = {k: round(v * 1e3, 6) for k, v in sim["dev 0"].items()}
    # dev 0: F0 + B0 = 3 ms compute, the copy from dev 1 arrives over its link, no idle
    assert ms == {"compute": 3.0, "copy": 0.5, "update": 0.0, "fill": 0.0, "idle": 0.0}
    assert round(sim["dev 1"]["idle"] * 1e3, 6) == 2.0  # busy 1 ms of the 3 ms makespan
    # real dev 0: 2.5 + 1 ms compute, 0.8 ms from dev 1 (host->0 counts too), 0.5 ms idle
    assert round(real["dev 0"]["compute"] * 1e3, 6) == 3.5
    assert round(real["dev 0"]["copy"] * 1e3, 6) == 0.9
    assert round(real["dev 0"]["idle"] * 1e3, 6) == 0.5
    assert out["worst_term"]["row"] == "dev 0" and out["worst_term"]["term"] == "compute"
    assert main(["compare-traces", str(s), str(r)]) == 0
    text = capsys.readouterr().out
    assert "copy/collective" in text and "largest miss: compute on dev 0" in text


def test_terms_of_kinds_and_names():
    from legionpy.optimizer.breakdown import term_of

    assert term_of("compute", "F:a[0]") == "compute"
    assert term_of("update", "U(w)") == "update" and term_of("compute", "U:b0.0[1]") == "update"
    assert term_of("collective", "allreduce") == "copy" and term_of("", "RS:b0.1") == "copy"
    assert term_of("fill", "fill g") == "fill"


def test_a_collective_counts_in_every_member_s_exchange():
    from legionpy.optimizer.breakdown import breakdown

    tl = [{"row": "comm:0-1,3", "kind": "collective", "name": "RS:b0.0", "start_s": 0.0,
           "end_s": 0.002},
          {"row": "dev 0", "kind": "compute", "name": "F:a[0]", "start_s": 0.0, "end_s": 0.001}]
    b = breakdown(tl, period_s=0.004)
    assert sorted(b) == ["dev 0", "dev 1", "dev 3"]
    assert all(b[r]["copy"] == 0.002 for r in b)
    assert b["dev 0"]["idle"] == pytest.approx(0.003)


def test_merged_ranks_share_rank_0s_clock(tmp_path):
    """Each rank's trace counts from its own start; merged, a rank that
    started 2.8 ms after rank 0 has its events moved 2.8 ms later, so a copy
    it received no longer ends before rank 0 sent it."""
    from legionpy.runtime.trace import write_merged

    send = {"name": "x.val", "ph": "X", "ts": 1000.0, "dur": 20.0, "pid": 0, "tid": 1}
    recv = {"name": "x.val", "ph": "X", "ts": 100.0, "dur": 50.0, "pid": 1, "tid": 1,
            "args": {"steps": [{"start": 1e-4, "end": 1.5e-4}]}}
    meta = {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "link"}}
    path = tmp_path / "t.json"
    write_merged(path, [[send], [recv, meta]], starts=[50.0, 50.0028])
    events = json.loads(path.read_text())["traceEvents"]
    got = {e["pid"]: e for e in events if e.get("ph") == "X"}
    assert got[0]["ts"] == 1000.0
    assert got[1]["ts"] == pytest.approx(2900.0)
    assert got[1]["ts"] + got[1]["dur"] >= got[0]["ts"]
    assert got[1]["args"]["steps"][0]["start"] == pytest.approx(2.9e-3)  # a collective's steps
    assert recv["ts"] == 100.0  # the rank's own record is left as it was
    assert [e for e in events if e.get("ph") == "M" and e["pid"] == 1][0] == meta
    write_merged(path, [[send], [recv]])  # no starts: as recorded
    assert json.loads(path.read_text())["traceEvents"][1]["ts"] == 100.0
