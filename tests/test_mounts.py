"""Which filesystem a path lies on, read from /proc/self/mountinfo, and whether a manager
may trust a directory's stat there (protocol/mounts.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from httk_flow.protocol import mounts
from httk_flow.protocol.fsio import fs

MOUNTINFO = "\n".join(
    [
        "21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
        "30 21 0:25 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw",
        "40 21 0:40 / /data rw,relatime shared:9 - nfs4 srv:/export rw,vers=4.2",
        "41 40 0:41 / /data/scratch rw,relatime shared:10 - lustre 10.0.0.1@tcp:/fs rw",
        "42 21 0:42 / /data2 rw - xfs /dev/sdb1 rw",
        r"43 21 0:43 / /mnt/my\040disk rw - cifs //srv/share rw",
        "44 21 0:44 / /over rw - ext4 /dev/sdc1 rw",
        "45 44 0:45 / /over rw - nfs srv:/other rw",
        "garbage without the separator",
        "46 21 0:46 / /short rw -",
    ]
)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/", "ext4"),
        ("/home/user/ws", "ext4"),
        ("/dev/shm/ws", "tmpfs"),
        ("/data", "nfs4"),
        ("/data/ws", "nfs4"),
        ("/data/scratch/ws", "lustre"),
        ("/data2/ws", "xfs"),  # /data is no prefix of /data2
        ("/mnt/my disk/ws", "cifs"),  # the kernel's octal escape of a space
        ("/over/ws", "nfs"),  # the later of two mounts at one point is the one seen
        ("/short/x", "ext4"),  # a line with no type is passed by
    ],
)
def test_the_longest_mount_point_holding_a_path_gives_its_type(path: str, kind: str) -> None:
    assert mounts.mount_type(MOUNTINFO, path) == kind


def test_a_later_mount_over_a_parent_hides_the_mounts_below_it() -> None:
    table = "\n".join(
        [
            "21 1 8:1 / / rw - ext4 /dev/sda1 rw",
            "41 21 0:41 / /data/scratch rw - lustre 10.0.0.1@tcp:/fs rw",
            "40 21 0:40 / /data rw - nfs4 srv:/export rw",
        ]
    )
    assert mounts.mount_type(table, "/data/scratch/ws") == "nfs4"


def test_only_a_newline_ends_a_line_of_the_table() -> None:
    # a mount point may hold a carriage return (the kernel escapes only \n, \t, space, \\)
    table = "21 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 21 0:40 / /data/a\rb rw - nfs4 srv:/e rw"
    assert mounts.mount_type(table, "/data/a\rb/ws") == "nfs4"


def test_no_mount_holding_the_path_is_unknown() -> None:
    assert mounts.mount_type("40 21 0:40 / /data rw - nfs4 srv:/e rw", "/home") is None


@pytest.mark.parametrize(
    ("kind", "cached"),
    [("ext4", False), ("tmpfs", False), ("lustre", False), ("gpfs", False), ("nfs4", True)],
)
def test_only_network_and_unknown_filesystems_may_answer_a_stat_from_a_cache(
    kind: str, cached: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mounts, "filesystem_type", lambda _path: kind)
    assert mounts.caches_attributes("/x") is cached
    monkeypatch.setattr(mounts, "filesystem_type", lambda _path: None)
    assert mounts.caches_attributes("/x") is True


@pytest.mark.skipif(not os.path.exists("/proc/self/mountinfo"), reason="Linux's mount table")
def test_this_machines_test_directory_is_found_in_its_mount_table(tmp_path: Path) -> None:
    kind = mounts.filesystem_type(str(tmp_path))
    assert kind is not None and kind != ""
    # the seam answers as the mount table does (a model may say otherwise)
    assert fs.caches_attributes(str(tmp_path)) is (kind not in mounts.COHERENT)
