"""Job groups: a name per submission (or one the user gives), carried in every marker as
a short digest, with the name kept once in .flow/groups/<digest>.json (protocol.md §2).

Selecting or counting by group then reads marker names only; the registry turns a
digest back into the name a user typed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import orjson

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import atomic_write, fs
from httk_flow.protocol.names import GROUP_DIGEST_LEN, check_group, group_digest
from httk_flow.protocol.workspace import Workspace

#: a registry file is a few names and numbers; anything larger is not one of ours
MAX_GROUP_FILE = 4096


def default_group() -> str:
    """The group of a `flow submit` that names none: `sub-YYYYmmdd-HHMMSS-xxxx` (UTC)."""
    return time.strftime("sub-%Y%m%d-%H%M%S-", time.gmtime()) + os.urandom(2).hex()


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One registry file: the group's name, its digest, when and by whom it was made."""

    name: str
    digest: str
    created: float
    by: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "digest": self.digest, "created": self.created, "by": self.by}


class GroupRegistry:
    """.flow/groups/<digest>.json, written once per group, cached per process."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._by_digest: dict[str, GroupRecord | None] = {}
        #: names whose record this process has seen or written (bulk submission
        #: publishes the group once per job)
        self._published: dict[str, str] = {}

    def check(self, name: str) -> str:
        """The digest of `name`; UsageError when the registry holds another name under it."""
        check_group(name)
        digest = group_digest(name)
        rec = self.get(digest)
        if rec is not None and rec.name != name:
            raise UsageError(
                f"has the same digest {digest} as the existing group {rec.name!r}",
                obj=f"group {name!r}",
                hint="choose another group name",
            )
        return digest

    def publish(self, name: str, *, by: str = "submit") -> str:
        """Register `name` (once) and return its digest; refuses a digest collision."""
        known = self._published.get(name)
        if known is not None:
            return known
        digest = self.check(name)
        if self._by_digest.get(digest) is not None:
            self._published[name] = digest  # check() found it under this very name
            return digest
        rec = GroupRecord(name, digest, round(time.time(), 3), by)
        path = layout.group_file(self.ws.root, digest)
        self.ws.ensure_dir(layout.groups_dir(self.ws.root))
        atomic_write(path, orjson.dumps(rec.to_json()), durable=self.ws.policy.durable)
        self._by_digest[digest] = rec
        self._published[name] = digest
        return digest

    def get(self, digest: str) -> GroupRecord | None:
        """The record of a digest; None when none was written (or it is unreadable)."""
        if digest in self._by_digest:
            return self._by_digest[digest]
        rec = self._read(digest)
        if rec is not None:
            self._by_digest[digest] = rec  # a missing one may appear: ask again later
        return rec

    def name_of(self, digest: str) -> str | None:
        rec = self.get(digest)
        return rec.name if rec is not None else None

    def find(self, name: str) -> GroupRecord | None:
        """The record of a group by its name; None when no submission made it."""
        rec = self.get(group_digest(name))
        return rec if rec is not None and rec.name == name else None

    def all(self) -> list[GroupRecord]:
        """Every readable record, oldest first."""
        try:
            entries = [e.name for e in fs.scandir(layout.groups_dir(self.ws.root))]
        except OSError:
            return []
        out = []
        for n in entries:
            digest, ext = os.path.splitext(n)
            if ext == ".json" and len(digest) == GROUP_DIGEST_LEN:
                rec = self.get(digest)
                if rec is not None:
                    out.append(rec)
        out.sort(key=lambda r: (r.created, r.name))
        return out

    def _read(self, digest: str) -> GroupRecord | None:
        try:
            d = orjson.loads(fs.read_bytes(layout.group_file(self.ws.root, digest), MAX_GROUP_FILE))
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(d, dict):
            return None
        name, created, by = d.get("name"), d.get("created", 0.0), d.get("by", "")
        # a name whose digest is another is kept as it is: publish() refuses it as a collision
        if not isinstance(name, str):
            return None
        if not isinstance(created, int | float) or isinstance(created, bool):
            created = 0.0
        return GroupRecord(name, digest, float(created), by if isinstance(by, str) else "")
