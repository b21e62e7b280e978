"""A workspace on disk: its format, its policy, its layout, and how to find it."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from httk_flow.errors import InvalidName, UnsafePath, UsageError, WorkspaceError
from httk_flow.protocol import layout
from httk_flow.protocol.fsio import atomic_write, fs, fsync_dir, real_dir
from httk_flow.protocol.journal import JournalReader, JournalWriter
from httk_flow.protocol.names import KEY_RE, Marker, class_dir, new_id
from httk_flow.protocol.states import State

FORMAT_NAME = "httk-flow"
FORMAT_VERSION = 1
FLOW_DIR = layout.FLOW_DIR  # the CLI takes it from here

#: the shortest lease accepted: file timestamps are as coarse as 1 s on some filesystems,
#: and a heartbeat on a loaded shared filesystem can take a good part of a second
MIN_LEASE = 1.0


def lease_problem(seconds: float) -> str | None:
    """Why `seconds` cannot be a manager lease, or None when it can."""
    if not seconds >= MIN_LEASE:  # also refuses NaN
        return (
            f"a lease of {seconds:g} s is below the floor of {MIN_LEASE:g} s "
            "(file timestamps and heartbeat writes are not finer than that)"
        )
    return None


def check_lease(seconds: float, option: str = "--lease") -> float:
    """`seconds` if it can be a lease; else a UsageError naming `option` and the floor."""
    why = lease_problem(seconds)
    if why is not None:
        raise UsageError(why, obj=option, hint=f"pass {option} {MIN_LEASE:g}s or more")
    return seconds


@dataclass(frozen=True)
class Policy:
    """Workspace-wide settings fixed at `flow init` (absent keys read as these defaults)."""

    #: seconds a manager's heartbeat stays valid
    lease: float = 30.0
    #: fsync every file and its directory before the rename that publishes it
    durable: bool = False
    #: a journal segment is closed and a new one started past this size
    segment_bytes: int = 16 * 1024 * 1024
    #: an attempt of a silent manager is taken over after lease * takeover_factor
    takeover_factor: float = 2.0
    #: allow taking over a persistent workdir on lease age alone (site decision)
    persistent_takeover: bool = False
    #: seconds before the first retry; doubled per further retry of an activation
    backoff_base: float = 2.0
    #: the longest backoff between two attempts
    backoff_cap: float = 600.0
    #: days to keep attempt directories of finished jobs before `flow gc` collects them
    keep_attempts_days: float = 7.0
    #: days to keep journal segments no marker references before `flow gc` deletes them
    keep_journal_days: float = 30.0
    #: keep every file of a committed attempt (by default what holds nothing the journal
    #: does not is removed at its commit: context.json, outcome.line, empty output)
    keep_attempt_files: bool = False
    #: "files": an attempt's output stays in files; "stream": at its commit it is appended
    #: to the manager's log segments and its files removed (protocol revision 5)
    logs: str = "files"
    #: a ready marker of a service class lies in its class's directory below its
    #: placement's, `@<class>/` (protocol revision 8): a manager passes by another pool's
    #: ready jobs without listing them. Set by `flow init`; absent: every ready marker lies
    #: in its placement's directory, as revisions up to 7 place them
    class_dirs: bool = False

    @classmethod
    def from_json(cls, data: object, where: str) -> Policy:
        if not isinstance(data, dict):
            raise WorkspaceError("policy is not an object", obj=where)
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise WorkspaceError(
                f"unknown policy key(s) {', '.join(unknown)}",
                obj=where,
                hint="this workspace was made by a newer httk_flow; upgrade it",
            )
        values: dict[str, Any] = {}
        for k, v in data.items():
            want = type(getattr(cls(), k))
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, want) or (want is not bool and isinstance(v, bool)):
                raise WorkspaceError(f"policy key {k} must be a {want.__name__}", obj=where)
            values[k] = v
        policy = cls(**values)
        if policy.logs not in LOG_MODES:
            raise WorkspaceError(
                f"policy key logs must be one of {', '.join(LOG_MODES)}, not {policy.logs!r}",
                obj=where,
            )
        if policy.segment_bytes < 4096:
            raise WorkspaceError("policy has tiny segments", obj=where)
        why = lease_problem(policy.lease)
        if why is not None:
            raise WorkspaceError(
                f"policy key lease: {why}",
                obj=where,
                hint=f"set the lease to {MIN_LEASE:g} or more",
            )
        return policy


#: policy keys newer than protocol revision 2
_WRITTEN_WHEN_SET = ("keep_attempt_files", "logs", "class_dirs")
#: where an attempt's output lives once it is committed (policy key `logs`)
LOG_MODES = ("files", "stream")


@dataclass(frozen=True)
class WorkspaceFormat:
    workspace_id: str
    created: float
    policy: Policy = field(default_factory=Policy)
    name: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "format": self.name,
                "version": self.version,
                "workspace_id": self.workspace_id,
                "created": self.created,
                "policy": self._policy_json(),
            },
            option=orjson.OPT_INDENT_2,
        )

    def _policy_json(self) -> dict[str, Any]:
        policy = asdict(self.policy)
        # written only when set: a reader of protocol revision 2 refuses a key it does not
        # know, and the default workspace stays shareable with such managers
        for key in _WRITTEN_WHEN_SET:
            if policy[key] == getattr(Policy, key):
                del policy[key]
        return policy

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> WorkspaceFormat:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise WorkspaceError(f"is not valid JSON ({e})", obj=where) from e
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise WorkspaceError("is not an httk-flow workspace format file", obj=where)
        version = data.get("version")
        if type(version) is not int or version != FORMAT_VERSION:
            raise WorkspaceError(
                f"has format version {version!r}; this httk_flow reads version {FORMAT_VERSION}",
                obj=where,
                hint="use the httk_flow version that created the workspace",
            )
        wid, created = data.get("workspace_id"), data.get("created")
        if not isinstance(wid, str) or not isinstance(created, int | float):
            raise WorkspaceError("lacks workspace_id or created", obj=where)
        return cls(wid, float(created), Policy.from_json(data.get("policy", {}), where))


class Workspace:
    """An open workspace: paths, policy, and this process's journal writer and reader."""

    def __init__(self, root: str, fmt: WorkspaceFormat) -> None:
        self.root = root
        self.format = fmt
        self.policy = fmt.policy
        self.flow = layout.flow_dir(root)
        self.state_root = layout.state_root(root)
        self.tmp = layout.tmp_dir(root)
        self.programs = layout.programs_dir(root)
        self.managers = layout.managers_dir(root)
        self.requests = layout.requests_dir(root)
        self.journal_dir = layout.journal_dir(root)
        self.host = socket.gethostname()
        self._writer: JournalWriter | None = None
        self._reader: JournalReader | None = None
        self._known_dirs: set[str] = set()
        self._safe_dirs: set[str] = set()
        self._real_state = os.path.realpath(self.state_root)
        #: ready markers of a class lie in its class directory (policy `class_dirs`)
        self.class_dirs = fmt.policy.class_dirs
        #: called after each successful transition made through this object (none: free)
        #: told of every transition made through this object (protocol.transition's
        #: TransitionObserver); typed loosely here, below the module that defines handles
        self.on_transition: list[Callable[..., None]] = []
        #: ends of jobs still to be counted into dependency sets (protocol/release.py):
        #: a release that ends dependents queues them here rather than recursing
        self.ends_queue: list[tuple[str, State]] | None = None

    # -- creation and discovery -------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str,
        *,
        durable: bool = False,
        lease: float | None = None,
        exist_ok: bool = False,
        keep_attempt_files: bool = False,
        logs: str = "files",
        class_dirs: bool = True,
    ) -> Workspace:
        if logs not in LOG_MODES:
            raise UsageError(f"must be one of {', '.join(LOG_MODES)}", obj=f"--logs {logs}")
        if logs == "stream" and keep_attempt_files:
            raise UsageError(
                "keeps every file of an attempt, and --logs stream removes its output files",
                obj="--keep-attempt-files",
                hint="give one of the two",
            )
        if lease is not None:
            check_lease(float(lease))
        root = os.path.abspath(path)
        flow = layout.flow_dir(root)
        if os.path.exists(layout.format_file(root)):
            if not exist_ok:
                raise UsageError(
                    "is already a workspace", obj=root, hint="pass --exist-ok to accept that"
                )
            return cls.open(root)
        policy = Policy(
            durable=durable,
            lease=float(lease) if lease is not None else Policy.lease,
            keep_attempt_files=keep_attempt_files,
            logs=logs,
            class_dirs=class_dirs,
        )
        fmt = WorkspaceFormat(workspace_id=new_id(), created=time.time(), policy=policy)
        os.makedirs(flow, exist_ok=True)
        for sub in layout.init_dirs(root):
            os.makedirs(sub, exist_ok=True)
        for st in State:
            os.makedirs(layout.state_dir(root, st.value), exist_ok=True)
        atomic_write(layout.format_file(root), fmt.to_json(), durable=True)
        fsync_dir(root)
        return cls(root, fmt)

    @classmethod
    def open(cls, path: str) -> Workspace:
        root = os.path.abspath(path)
        where = layout.format_file(root)
        try:
            raw = fs.read_bytes(where, 1 << 20)
        except FileNotFoundError:
            raise WorkspaceError(
                "is not a workspace (no .flow/format.json)",
                obj=root,
                hint="create one with `flow init`",
            ) from None
        except OSError as e:
            raise WorkspaceError(f"cannot read ({e.strerror})", obj=where) from e
        return cls(root, WorkspaceFormat.from_json(raw, where))

    @classmethod
    def find(cls, explicit: str | None = None, start: str | None = None) -> Workspace:
        """-w PATH, else $FLOW_WORKSPACE, else the nearest ancestor holding .flow/."""
        chosen = explicit or os.environ.get(layout.ENV_WORKSPACE)
        if chosen:
            return cls.open(chosen)
        here = Path(start or os.getcwd()).resolve()
        for d in (here, *here.parents):
            if Path(layout.format_file(str(d))).is_file():
                return cls.open(str(d))
        raise WorkspaceError(
            f"no workspace found in {here} or any parent directory",
            hint="pass -w PATH, set FLOW_WORKSPACE, or create one with `flow init`",
        )

    # -- layout ------------------------------------------------------------------

    def state_dir(self, state: State, placement: str = "") -> str:
        return layout.state_dir(self.root, state.value, placement)

    def marker_path(self, state: State, placement: str, marker: Marker) -> str:
        # hot (twice per transition): from the state root computed once
        service = marker.service
        cls_dir = self.class_dir_of(state, service) if service else ""
        return layout.state_marker(self.state_root, state.value, placement, marker.name, cls_dir)

    def class_dir_of(self, state: State, service: str) -> str:
        """The class directory that a marker of class `service` lies in, in `state`, below
        its placement's directory ("": that directory itself)."""
        if service and state is State.READY and self.class_dirs:
            return class_dir(service)
        return ""

    def job_dir(self, placement: str, key: str) -> str:
        return layout.job_dir(self.root, placement, key)

    def program_path(self, digest: str) -> str:
        return layout.program_path(self.root, digest)

    def job_holding(self, placement: str) -> str | None:
        """The key of a job whose directory is, or holds, `placement` (its own children's
        place), found by its job.json; None when no job's directory does."""
        parts = placement.split("/")
        for i in range(1, len(parts)):
            if KEY_RE.fullmatch(parts[i]) and fs.exists(
                layout.job_file(self.job_dir("/".join(parts[:i]), parts[i]))
            ):
                return parts[i]
        return None

    def check_room(self, placement: str, obj: str) -> None:
        """A user's placement must be the workspace's own directories, none a job's (InvalidName
        naming `obj` says why not)."""
        if (link := self.placement_link(placement)) is not None:
            raise InvalidName(
                f"passes through the symbolic link {link}; flow places jobs only in the "
                "workspace's own directories (a link may lead out of it, or into a job's)",
                obj=obj,
            )
        if (holder := self.job_holding(placement)) is not None:
            # flow would take it for that job's child: cancelled with it, and so on
            raise InvalidName(
                f"is within the directory of job {holder}, where flow places only its "
                "children; place jobs in a directory of their own",
                obj=obj,
            )

    def placement_link(self, placement: str) -> str | None:
        """The first directory of `placement` (relative to the workspace) that is a symbolic
        link, None when none is: a link may lead out of the workspace, or into a job's own
        directory. Components not made yet are made as real directories."""
        path, parts = self.root, placement.split("/")
        for i, part in enumerate(parts):
            path = f"{path}/{part}"
            try:
                st = fs.lstat(path)
            except OSError:
                return None  # not there yet: submission makes it
            if stat.S_ISLNK(st.st_mode):
                return "/".join(parts[: i + 1])
        return None

    def ensure_dir(self, path: str) -> None:
        """mkdir -p, remembered so hot paths pay for it once per directory per process."""
        if path in self._known_dirs:
            return
        os.makedirs(path, exist_ok=True)
        self._known_dirs.add(path)

    def check_state_dir(self, path: str, *, again: bool = False) -> bool:
        """Refuse a state directory that leads out of the state tree (a planted symlink).

        Checked once per directory per process: a plain directory is its parent's real
        path (fsio.real_dir, one lstat); a link, or `again` (someone else made it), is
        resolved whole. False when there is no such directory (nothing to check yet)."""
        if path in self._safe_dirs and not again:
            return True
        parent, _, name = path.rpartition("/")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False  # about to be made; checked again once it exists
        if not again and name and stat.S_ISDIR(st.st_mode):
            self._place_state_dir(path, os.path.join(real_dir(parent), name))
        else:
            self._place_state_dir(path, os.path.realpath(path))
        return True

    def made_state_dir(self, path: str) -> None:
        """A state directory this process has just made with mkdir: a plain directory,
        so its parent's real path and its name place it, with no call for itself."""
        parent, _, name = path.rpartition("/")
        self._place_state_dir(path, os.path.join(real_dir(parent), name))

    def _place_state_dir(self, path: str, real: str) -> None:
        if real != self._real_state and not real.startswith(self._real_state + os.sep):
            raise UnsafePath(
                "leads out of the workspace's state tree; refusing to use it",
                obj=path,
                hint="remove the symbolic link and run `flow fsck`",
            )
        self._safe_dirs.add(path)

    def forget_dir(self, path: str) -> None:
        self._known_dirs.discard(path)

    # -- journal -----------------------------------------------------------------

    @property
    def writer(self) -> JournalWriter:
        if self._writer is None:
            self._writer = JournalWriter(
                self.journal_dir,
                durable=self.policy.durable,
                segment_bytes=self.policy.segment_bytes,
            )
        return self._writer

    @property
    def reader(self) -> JournalReader:
        if self._reader is None:
            self._reader = JournalReader(self.journal_dir)
        return self._reader

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader is not None:
            self._reader.close()
