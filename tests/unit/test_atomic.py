"""Atomic writes leave the previous file intact when the writer fails."""

import json
import os

import pytest

from legionpy.atomic import atomic_write, atomic_write_json


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "strategy.json"
    atomic_write_json(path, {"v": 1})

    def crash(f):
        f.write('{"v": 2, "half')
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["strategy.json"]


def test_binary_write_and_options(tmp_path):
    atomic_write(tmp_path / "a.bin", lambda f: f.write(b"\x00\x01"), binary=True)
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    atomic_write_json(tmp_path / "b.json", {"k": (1, 2)}, indent=2)
    assert json.loads((tmp_path / "b.json").read_text()) == {"k": [1, 2]}
