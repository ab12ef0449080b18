"""common.errors' full-disk error: found anywhere in an exception's chain, one line, and the
same error after crossing a process boundary."""

from __future__ import annotations

import errno
import pickle

from common.errors import DiskFullError, disk_full, is_user_error
from tests.support.disks import small_tmpfs


def test_a_full_disk_deep_in_a_library_is_found_and_named():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/out/part-0.parquet")
        except OSError as inner:
            raise RuntimeError("while running 'Write'") from inner
    except RuntimeError as outer:
        found = disk_full(outer)
    assert isinstance(found, DiskFullError) and is_user_error(found)
    assert str(found).startswith("no space left on the device writing /data/out/part-0.parquet")
    assert disk_full(RuntimeError("other")) is None
    assert disk_full(OSError(errno.EACCES, "denied")) is None


def test_the_error_names_what_was_needed_and_survives_pickling(tmp_path):
    with small_tmpfs(tmp_path, "64k") as disk:
        error = DiskFullError(str(disk / "shard.tar"), needed=184_320)
        assert str(error) == (f"no space left on the device writing {disk}/shard.tar: it needs "
                              "184.3 KB, 65.5 KB left there")
        again = pickle.loads(pickle.dumps(error))
        assert (type(again), str(again), again.needed) == (DiskFullError, str(error), 184_320)
