"""Dependency sets (protocol.md §14): what `flow submit --after` waits for, stored so that
a finished job costs O(its sets) and a set that is decided costs O(its dependents).

A set is the selector's jobs as they were at submission: `pending/` holds the members not
yet counted, one rename each into `ended/` counts a member exactly once, and whoever
removes the emptied `pending/` (or creates `broken`) has decided the set.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.errors import InvalidJob, UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import fs, fsync_dir, write_file
from httk_flow.protocol.handles import JobHandle
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: the most dependency selectors one job may name
MAX_AFTER = 64


class AfterPolicy(enum.Enum):
    """What a dependent does when a job it waits for does not succeed."""

    #: run once every dependency succeeded; one that fails or is cancelled cancels it
    OK = "ok"
    #: run once every dependency ended, however it ended
    ANY = "any"
    #: as ok, but the dependent fails (dependency_failure: `flow resume` runs it anyway)
    FAIL = "fail"
    #: as ok, but a failed dependency keeps it waiting (resume that one and it may succeed);
    #: a cancelled one cancels it
    WAIT = "wait"

    @classmethod
    def parse(cls, text: str, what: str = "--after-policy") -> AfterPolicy:
        try:
            return cls(text)
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise UsageError(f"is not one of {choices}", obj=f"{what} {text!r}") from None

    def counts(self, state: State) -> bool:
        """Does a member ending in `state` count as ended for this set?"""
        return not (self is AfterPolicy.WAIT and state is State.FAILED)

    def breaks(self, state: State) -> bool:
        """Does a member ending in `state` decide the set against its dependents?"""
        if self is AfterPolicy.ANY:
            return False
        if self is AfterPolicy.WAIT:
            return state is State.CANCELLED
        return state in (State.FAILED, State.CANCELLED)


_SET_CHARS = frozenset("0123456789abcdef")


def check_set_id(text: str, where: str) -> str:
    if len(text) != 20 or not set(text) <= _SET_CHARS:
        raise InvalidJob(f"names a dependency set {text!r} that is not 20 hex digits", obj=where)
    return text


def new_set_id() -> str:
    return os.urandom(10).hex()


@dataclass(frozen=True, slots=True)
class After:
    """One `--after` of a job (job.json `after`): the set it waits for and the policy."""

    set: str
    selector: str
    policy: AfterPolicy

    def to_json(self) -> dict[str, str]:
        return {"set": self.set, "selector": self.selector, "policy": self.policy.value}

    @classmethod
    def from_json(cls, data: object, where: str) -> After:
        if not isinstance(data, Mapping):
            raise InvalidJob("has an `after` entry that is not an object", obj=where)
        s, sel, pol = data.get("set"), data.get("selector"), data.get("policy")
        if not isinstance(s, str) or not isinstance(sel, str) or not isinstance(pol, str):
            raise InvalidJob("has an `after` entry without set, selector and policy", obj=where)
        try:
            policy = AfterPolicy(pol)
        except ValueError:
            raise InvalidJob(f"has an unknown `after` policy {pol!r}", obj=where) from None
        return cls(check_set_id(s, where), sel, policy)


def afters_from_json(data: Any, where: str) -> tuple[After, ...]:
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > MAX_AFTER:
        raise InvalidJob(f"has an `after` that is not a list of at most {MAX_AFTER}", obj=where)
    return tuple(After.from_json(d, where) for d in data)


@dataclass(frozen=True, slots=True)
class SetStatus:
    """Where one dependency set stands, from at most three lookups."""

    set: str
    exists: bool
    complete: bool  # every member ended (as the policy counts ends)
    broken: str | None  # "<member key> <state>": the end that decided it against
    members: int = 0
    ended: Mapping[str, int] | None = None  # state -> members, when counted


def _entry_name(policy: AfterPolicy, set_id: str) -> str:
    return f"{set_id}.{policy.value}"


def _split_entry(name: str) -> tuple[str, AfterPolicy] | None:
    set_id, _, pol = name.partition(".")
    try:
        return set_id, AfterPolicy(pol)
    except ValueError:
        return None


class DependencySets:
    """The sets of one workspace: making them, listing their dependents, reading them."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.root = layout.after_dir(ws.root)

    def set_dir(self, set_id: str) -> str:
        return layout.after_set_dir(self.ws.root, set_id)

    def create(
        self,
        selector: str,
        policy: AfterPolicy,
        members: Iterable[JobHandle],
        *,
        actor: str,
        set_id: str | None = None,
    ) -> tuple[str, list[JobHandle]]:
        """Publish a set of `members` (as they are now); returns its id and the members
        still pending, whose watch entries the caller must make (`watch`). A set whose
        id exists already (a resumed batch) is kept as it is."""
        ws, durable = self.ws, self.ws.policy.durable
        set_id = set_id or new_set_id()
        final = self.set_dir(set_id)
        if fs.exists(final):
            return set_id, self.pending_members(set_id)
        tmp = os.path.join(ws.tmp, f"after-{set_id}.{os.urandom(4).hex()}")
        os.makedirs(os.path.join(tmp, "ended"))
        os.mkdir(os.path.join(tmp, "pending"))
        pending: list[JobHandle] = []
        broken = None
        seen: set[str] = set()
        for h in members:
            if h.key in seen:
                continue
            seen.add(h.key)
            if h.state.is_terminal and policy.counts(h.state):
                write_file(
                    os.path.join(tmp, "ended", f"{h.key}.{h.state.value}"), b"", durable=False
                )
                if broken is None and policy.breaks(h.state):
                    broken = f"{h.key} {h.state.value}"
            else:
                pending.append(h)
                write_file(os.path.join(tmp, "pending", h.key), h.placement.encode(), durable=False)
        body = {
            "set": set_id,
            "selector": selector,
            "policy": policy.value,
            "members": len(seen),
            "created": round(time.time(), 3),
            "by": actor,
        }
        write_file(os.path.join(tmp, "set.json"), orjson.dumps(body), durable=durable)
        write_file(os.path.join(tmp, "dependents"), b"", durable=durable)
        if broken is not None:
            write_file(os.path.join(tmp, "broken"), broken.encode(), durable=durable)
        if not pending:
            os.rmdir(os.path.join(tmp, "pending"))
        if durable:
            for d in ("ended", "pending", ""):
                if os.path.isdir(os.path.join(tmp, d)):
                    fsync_dir(os.path.join(tmp, d))
        os.makedirs(self.root, exist_ok=True)
        try:
            fs.rename(tmp, final)
        except OSError as e:
            # two submitters of one resumed batch: the other one's set stands
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            _rmtree(tmp)
            return set_id, self.pending_members(set_id)
        if durable:
            fsync_dir(self.root)
        return set_id, pending

    def pending_members(self, set_id: str) -> list[JobHandle]:
        """The members of a set not counted yet, as placeholders (key and placement: what
        watching them needs), for a submitter that finds the set made already: the one
        that made it may have died before watching them."""
        d = os.path.join(self.set_dir(set_id), "pending")
        out = []
        for key in _names(d):
            try:
                placement = fs.read_bytes(os.path.join(d, key), 4096).decode()
            except OSError:
                continue
            out.append(JobHandle(State.SUBMITTED, placement, _placeholder(key)))
        return out

    def watch(self, set_id: str, policy: AfterPolicy, members: Iterable[JobHandle]) -> None:
        """Make each pending member's watch entry, so its end finds the set."""
        durable = self.ws.policy.durable
        entry = _entry_name(policy, set_id)
        for h in members:
            d = layout.watch_member(self.ws.root, h.key)
            for _ in range(5):
                os.makedirs(d, exist_ok=True)
                try:
                    write_file(os.path.join(d, entry), h.placement.encode(), durable=durable)
                    break
                except FileExistsError:
                    break
                except FileNotFoundError:
                    continue  # the member's end removed its emptied watch directory

    def add_dependents(self, set_id: str, jobs: Iterable[tuple[str, str]]) -> None:
        """List dependents (key, placement) before they are published: one append."""
        data = b"".join(f"{key} {placement}\n".encode() for key, placement in jobs)
        if not data:
            return
        path = os.path.join(self.set_dir(set_id), "dependents")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.ws.policy.durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def dependents(self, set_id: str) -> list[tuple[str, str]]:
        """The dependents listed for a set (a torn last line is skipped)."""
        try:
            with open(os.path.join(self.set_dir(set_id), "dependents"), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        out = []
        for line in raw.split(b"\n"):
            key, _, placement = line.decode(errors="replace").partition(" ")
            if key and placement:
                out.append((key, placement))
        return out

    def status(self, set_id: str, *, count: bool = False) -> SetStatus:
        """Is the set complete or broken; with `count`, its members counted by end."""
        d = self.set_dir(set_id)
        # pending/ first: a breaking end writes `broken` before its count, so a set seen
        # complete here shows its `broken` below
        complete = not fs.exists(os.path.join(d, "pending"))
        try:
            broken: str | None = fs.read_bytes(os.path.join(d, "broken"), 4096).decode()
        except OSError:
            broken = None
        if complete and not fs.exists(d):
            return SetStatus(set_id, False, False, None)
        if not count:
            return SetStatus(set_id, True, complete, broken)
        ended: dict[str, int] = {}
        for e in _names(os.path.join(d, "ended")):
            st = e.rpartition(".")[2]
            ended[st] = ended.get(st, 0) + 1
        pending = len(_names(os.path.join(d, "pending")))
        return SetStatus(set_id, True, complete, broken, sum(ended.values()) + pending, ended)

    def info(self, set_id: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads(
                fs.read_bytes(os.path.join(self.set_dir(set_id), "set.json"), 1 << 16)
            )
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def released(self, set_id: str) -> str | None:
        """What the last release of the set's dependents saw: "complete", "broken", None."""
        try:
            return fs.read_bytes(os.path.join(self.set_dir(set_id), "released"), 64).decode()
        except OSError:
            return None

    def mark_released(self, set_id: str, what: str) -> None:
        d = self.set_dir(set_id)
        tmp = os.path.join(d, f".released.{os.urandom(4).hex()}")
        write_file(tmp, what.encode(), durable=self.ws.policy.durable)
        os.replace(tmp, os.path.join(d, "released"))

    def all_sets(self) -> list[str]:
        return [n for n in _names(self.root) if len(n) == 20 and set(n) <= _SET_CHARS]


def _placeholder(key: str) -> Marker:
    return Marker(key, 0, 0, RecordRef("x", 0, 0))


def _names(path: str) -> list[str]:
    try:
        return [e.name for e in fs.scandir(path)]
    except OSError:
        return []


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a dependent's sets say now: "ready", "wait", "cancel" or "fail", and why."""

    kind: str
    reason: str


def verdict(ws: Workspace, afters: Iterable[After]) -> Verdict:
    """Decide a dependent from its sets: a broken set decides at once, even while others
    are open; ready only when every set is complete."""
    sets = DependencySets(ws)
    waiting = []
    for a in afters:
        st = sets.status(a.set)
        if not st.exists:
            return Verdict("fail", f"the record of its dependency set {a.set} is missing")
        if st.broken is not None:
            key, _, state = st.broken.partition(" ")
            why = f"dependency {key} {state} (after {a.selector}, policy {a.policy.value})"
            return Verdict("fail" if a.policy is AfterPolicy.FAIL else "cancel", why)
        if not st.complete:
            waiting.append(a.selector)
    if waiting:
        return Verdict("wait", "waits for " + ", ".join(waiting))
    return Verdict("ready", "dependencies met")
