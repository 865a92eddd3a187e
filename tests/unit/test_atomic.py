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


def test_files_get_the_users_umask_and_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "new.json", {})
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        atomic_write_json(tmp_path / "private.json", {})
        assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600
        os.chmod(tmp_path / "new.json", 0o640)
        atomic_write_json(tmp_path / "new.json", {"v": 2})
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_a_missing_folder_names_the_target(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        atomic_write_json(tmp_path / "no" / "s.json", {})
    assert e.value.filename == str(tmp_path / "no" / "s.json")
