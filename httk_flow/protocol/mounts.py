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
    text gives them: the longest mount point holding it, the later of two at one point
    (a mount over another). None when no line holds it."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split(" ")
        if not sep or len(fields) < 5 or not right.split(" ")[0]:
            continue
        # the kernel escapes space, tab, newline and backslash as three octal digits
        point = _OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[4])
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), right.split(" ")[0]
    return kind


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
