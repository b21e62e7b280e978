"""Which filesystem a path lies on, and whether its clients see others' changes at once.

A manager may trust a directory's attributes (one stat, where a listing costs many
calls) only where no client caches them past another host's rename into it: local
filesystems, and the cluster filesystems that keep their clients coherent with locks
or tokens. An NFS or SMB client may answer from an attribute cache for up to a minute.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Final

#: filesystems whose directory attributes, read here, never lag a rename made elsewhere
COHERENT: Final = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "vfat",
        "exfat",
        "ntfs3",
        "nilfs2",
        "reiserfs",
        "btrfs",
        "bcachefs",
        "f2fs",
        "jfs",
        "zfs",
        "tmpfs",
        "ramfs",
        "overlay",
        "lustre",
        "gpfs",
    }
)
_OCTAL = re.compile(r"\\([0-7]{3})")


def mount_type(mountinfo: str, path: str) -> str | None:
    """The type of the mount `path` (absolute, resolved) lies on, as /proc/self/mountinfo
    text gives them, in the order they were mounted: the longest mount point holding it
    of those not hidden by a later mount at or above their point. None when none holds it."""
    seen: list[tuple[str, str]] = []  # (point, type), the visible ones
    for line in mountinfo.split("\n"):  # only a newline ends a line (others are in names)
        left, sep, right = line.partition(" - ")
        fields = left.split(" ")
        kind = right.split(" ")[0]
        if not sep or len(fields) < 5 or not kind:
            continue
        # the kernel escapes space, tab, newline and backslash as three octal digits
        point = _OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4])
        seen = [(p, k) for p, k in seen if not _within(p, point)]
        seen.append((point, kind))
    holding = [(len(p), k) for p, k in seen if _within(path, p)]
    return max(holding)[1] if holding else None


def _within(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


@functools.lru_cache(maxsize=64)
def filesystem_type(path: str) -> str | None:
    """The type of the filesystem `path` lies on (None: unknown, as off Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return None
    return mount_type(text, os.path.realpath(path))


def caches_attributes(path: str) -> bool:
    """Whether a directory's attributes read here may lag a rename into it made on another
    host (unknown filesystems included): what a look deciding to stop must not trust."""
    return filesystem_type(path) not in COHERENT
