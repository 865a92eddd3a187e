import importlib.util

import pytest


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("mpi4py") is None:
        skip = pytest.mark.skip(reason="mpi4py is not installed")
        for item in items:
            if "mpi" in item.keywords:
                item.add_marker(skip)
