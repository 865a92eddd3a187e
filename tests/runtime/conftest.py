from __future__ import annotations

import pytest

import legionpy.runtime as lr


@pytest.fixture
def rt1():
    """A fresh runtime with one CPU device; shut down afterwards."""
    rt = lr.init(cpus=1)
    yield rt
    lr.shutdown()


@pytest.fixture
def rt2():
    """A fresh threaded runtime with 2 CPU devices; shut down afterwards."""
    rt = lr.init(cpus=2, executor="threads")
    yield rt
    lr.shutdown()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private LEGIONPY_CACHE (cost tables, calibrations, profiles)."""
    monkeypatch.setenv("LEGIONPY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def seed_overhead(cache):
    """``seed(machine_name="local:2") -> path``: fixed machine-model figures
    in the private cache (seeded.py), so a command that predicts reads them
    instead of calibrating."""
    from seeded import seed_overhead as seed

    return lambda machine_name="local:2": seed(cache, machine_name)


@pytest.fixture
def rt4():
    """A fresh threaded runtime with 4 CPU devices; shut down afterwards."""
    rt = lr.init(cpus=4, executor="threads")
    yield rt
    lr.shutdown()


@pytest.fixture(params=["threads", "serial"])
def rt(request):
    rt = lr.init(cpus=2, executor=request.param)
    yield rt
    lr.shutdown()


@pytest.fixture
def emu(monkeypatch):
    """``emu(n, executor)``: a runtime on ``n`` emulated GPUs
    (``LEGIONPY_GPU_BACKEND=emulated``, runtime/emugpu.py); shut down afterwards."""
    def start(n: int = 2, executor: str = "threads"):
        monkeypatch.setenv("LEGIONPY_GPU_BACKEND", "emulated")
        monkeypatch.setenv("LEGIONPY_GPUS", str(n))
        return lr.init(executor=executor)
    yield start
    lr.shutdown()
