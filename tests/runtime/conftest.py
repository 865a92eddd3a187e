from __future__ import annotations

import pytest

import legionpy.runtime as lr


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
