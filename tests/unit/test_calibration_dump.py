"""``LEGIONPY_CALIBRATION_ROWS`` (legionpy/measure/calibration.py): a
calibration's rows, task graphs and pre-fit overhead, for
``bench/refit_locks.py``."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import legionpy.runtime as lr
from legionpy.measure.calibration import _dump_rows
from legionpy.optimizer.fidelity import RuntimeOverhead


def test_the_rows_are_written_only_when_asked(tmp_path, monkeypatch):
    lr.init(cpus=1)
    try:
        ovh = RuntimeOverhead(task_s=9e-6, gil_kernel_s=1e-4, cores=2,
                              calibration={"rows": ["not repeated"]})
        rows = [{"model": "mlp_4", "strategy": "data", "period_s": 1e-3}]
        graphs = [({"tasks": [1, 2]}, SimpleNamespace(name="mlp_4"))]
        path = tmp_path / "rows.pkl"
        monkeypatch.delenv("LEGIONPY_CALIBRATION_ROWS", raising=False)
        _dump_rows(ovh, rows, graphs, True)
        assert not path.exists()
        monkeypatch.setenv("LEGIONPY_CALIBRATION_ROWS", str(path))
        _dump_rows(ovh, rows, graphs, False)
    finally:
        lr.shutdown()
    dump = pickle.loads(path.read_bytes())
    assert dump["rows"] == rows and dump["models"] == ["mlp_4"]
    assert dump["taskgraphs"] == [{"tasks": [1, 2]}] and dump["fit_copy"] is False
    back = RuntimeOverhead(**dump["overhead"])
    assert back.task_s == 9e-6 and back.gil_kernel_s == 1e-4 and back.calibration is None
