"""Region, FieldSpace and Subregion: attributes, validation, runtime delegation."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from legionpy.errors import FieldError, RegionError
from legionpy.geometry import Rect
from legionpy.regions import FieldSpace, Partition, Region, Subregion


def test_region_attributes():
    R = Region((1024, 512), {"x": np.float32, "y": "float64"}, name="A")
    assert R.shape == (1024, 512) and R.ndim == 2
    assert R.rect == Rect((0, 0), (1024, 512))
    assert R.root is R and R.name == "A"
    assert isinstance(R.fields, FieldSpace)
    assert list(R.fields) == ["x", "y"]
    assert R.fields["x"] == np.dtype(np.float32) and R.fields["y"] == np.dtype("float64")
    assert R.volume == 1024 * 512


def test_uid_is_a_creation_counter_and_default_name_uses_it():
    a = Region((4,), {"x": np.int32})
    b = Region(4, {"x": np.int32})
    assert b.uid == a.uid + 1
    assert a.name == f"region{a.uid}"
    assert b.shape == (4,)


def test_fieldspace_is_ordered_hashable_and_reusable():
    fs = FieldSpace([("b", np.int8), ("a", np.complex64)])
    assert fs.names == ("b", "a") and len(fs) == 2 and "a" in fs
    assert fs == FieldSpace({"b": "i1", "a": "c8"}) and hash(fs) == hash(FieldSpace(fs))
    assert fs != FieldSpace({"a": "c8", "b": "i1"})  # order matters
    R = Region((2, 2), fs)
    assert R.fields is fs
    assert fs.itemsize("a") == 8
    assert fs.resolve(()) == ("b", "a")


@pytest.mark.parametrize("dtype", ["foo", object, None, "U8", np.dtype([("a", "f4")])])
def test_bad_dtype_fails_naming_field_and_dtype(dtype):
    with pytest.raises(FieldError) as info:
        Region((4,), {"weights": dtype})
    msg = str(info.value)
    assert "'weights'" in msg
    if isinstance(dtype, str):
        assert dtype in msg


def test_object_dtype_is_rejected():
    with pytest.raises(FieldError, match="'o'.*object"):
        FieldSpace({"o": np.object_})


@pytest.mark.parametrize("fields", [{"": np.float32}, {3: np.float32}, [("x", "f4", 1)], 5])
def test_bad_field_names_fail(fields):
    with pytest.raises(FieldError):
        FieldSpace(fields)


def test_unknown_field_fails_naming_it():
    R = Region((4,), {"x": np.float32}, name="A")
    with pytest.raises(FieldError, match=r"'nope'.*\['x'\]"):
        R.fields["nope"]
    with pytest.raises(FieldError, match=r"'nope' of A"):
        R.read("nope")


@pytest.mark.parametrize("shape", [(), (4, -1), (2.5,), "ab", None, (True, 2)])
def test_bad_shape_fails_naming_it(shape):
    with pytest.raises(RegionError) as info:
        Region(shape, {"x": np.float32})
    assert repr(shape) in str(info.value)


class _FakeRuntime:
    def __init__(self):
        self.calls = []

    def read_region(self, region, field):
        self.calls.append(("read", region, field))
        return np.zeros(region.shape, dtype=region.fields[field])

    def write_region(self, region, field, array):
        self.calls.append(("write", region, field, array))


@pytest.fixture
def fake_runtime(monkeypatch):
    from legionpy.regions import region

    rt = _FakeRuntime()
    monkeypatch.setattr(region, "_data_owner", lambda: rt)
    return rt


def test_read_and_write_delegate_to_the_runtime(fake_runtime):
    R = Region((4, 2), {"x": np.float32})
    a = R.read("x")
    assert a.shape == (4, 2) and a.dtype == np.float32
    arr = np.ones((4, 2), np.float32)
    R.write("x", arr)
    sub = Partition.equal(R, (2, 1))[1, 0]
    assert sub.read("x").shape == (2, 2)
    sub.write("x", arr[:2])
    kinds = [(c[0], c[1], c[2]) for c in fake_runtime.calls]
    assert kinds == [("read", R, "x"), ("write", R, "x"), ("read", sub, "x"), ("write", sub, "x")]
    assert fake_runtime.calls[1][3] is arr


def test_subregion_attributes():
    R = Region((8, 6), {"x": np.float32}, name="A")
    P = Partition.equal(R, (2, 3))
    s = P[1, 2]
    assert isinstance(s, Subregion)
    assert s.root is R and s.partition is P and s.parent is P and s.color == (1, 2)
    assert s.rect == Rect((4, 4), (8, 6)) and s.shape == (4, 2) and s.ndim == 2
    assert s.fields is R.fields and s.volume == 8
    assert P[1, 2] is s  # cached: the same object each time
    assert "A" in s.name and "A" in repr(s)


def test_data_access_without_a_runtime_says_what_to_do():
    """regions never import the runtime: it installs itself as the data
    owner when imported; before that, read and write fail naming the fix."""
    import subprocess

    code = ("import numpy as np\n"
            "from legionpy.errors import RegionError\n"
            "from legionpy.regions import Region\n"
            "R = Region((4,), {'x': np.float32}, name='A')\n"
            "try:\n"
            "    R.read('x')\n"
            "except RegionError as e:\n"
            "    print(e)\n"
            "import legionpy.runtime\n"
            "print(R.read('x').tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "A.read('x')" in out[0] and "import legionpy.runtime" in out[0]
    assert out[1] == "[0.0, 0.0, 0.0, 0.0]"
