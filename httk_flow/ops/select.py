"""Selections: the jobs a command acts on, from JOB idents, tags, groups and states.

Every selection-taking command parses its selectors into one `Selection`; tags, groups
and states are filters on marker names, so selecting never opens a job file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from httk_flow.errors import JobNotFound, UsageError
from httk_flow.ops.lookup import ident_matches, not_one
from httk_flow.protocol import names
from httk_flow.protocol.groups import GroupRegistry
from httk_flow.protocol.jobs import all_jobs
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace


@dataclass(frozen=True)
class Selection:
    """What a user selected. Different selectors combine with AND; the values of one
    (two --tag, two --state) are alternatives. Nothing at all (and not `all`) selects
    every job for reading commands; steering commands refuse it (`empty`)."""

    idents: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    states: tuple[State, ...] = ()
    all: bool = False

    @property
    def empty(self) -> bool:
        """Nothing asked for: no JOB, no filter, no --all."""
        return not (self.idents or self.tags or self.groups or self.states or self.all)

    @property
    def filters(self) -> bool:
        """Whether it selects by more than JOB idents (the bulk prompt asks for these)."""
        return bool(self.tags or self.groups or self.states or self.all)

    @property
    def filters_but_all(self) -> bool:
        """Whether it filters by tag, group or state (`--all` filters nothing)."""
        return bool(self.tags or self.groups or self.states)

    def narrowing(self) -> str:
        """The filters in the words of the command line: `--tag a --state failed`."""
        words = [f"--tag {t}" for t in self.tags] + [f"--group {g}" for g in self.groups]
        return " ".join(words + [f"--state {s.value}" for s in self.states])


class _Filter:
    """A selection's filters, made once: each test reads the marker name alone."""

    def __init__(self, ws: Workspace, sel: Selection) -> None:
        reg = GroupRegistry(ws)
        digests = []
        for g in sel.groups:
            names.check_group(g)
            if reg.find(g) is None:
                raise JobNotFound(
                    "is no group of this workspace",
                    obj=f"group {g!r}",
                    hint="see the groups with `flow groups`",
                )
            digests.append(names.group_digest(g))
        for t in sel.tags:
            names.check_tag(t)
        self.tags = frozenset(sel.tags)
        self.digests = frozenset(digests)
        self.states = frozenset(sel.states)

    def __call__(self, h: JobHandle) -> bool:
        return (
            (not self.tags or h.marker.tag in self.tags)
            and (not self.digests or h.marker.group_digest in self.digests)
            and (not self.states or h.state in self.states)
        )


def matcher(ws: Workspace, sel: Selection) -> Callable[[JobHandle], bool]:
    """The test of a selection's tag, group and state filters on one job's marker."""
    return _Filter(ws, sel)


def select(ws: Workspace, sel: Selection) -> Iterator[JobHandle]:
    """The selected jobs, streamed, each key once. Each JOB ident must name exactly one
    job that passes the filters (JobNotFound otherwise, as for a single JOB)."""
    keep = _Filter(ws, sel)
    seen: set[str] = set()
    if sel.idents:
        for ident in sel.idents:
            found = [h for h in ident_matches(ws, ident) if keep(h)]
            if len(found) != 1:
                raise not_one(ws, ident.strip(), found, sel.narrowing())
            if found[0].key not in seen:
                seen.add(found[0].key)
                yield found[0]
        return
    for h in all_jobs(ws, sel.states or tuple(State)):
        # a job moving between two listings may be seen twice: one key, one job
        if keep(h) and h.key not in seen:
            seen.add(h.key)
            yield h


def one(ws: Workspace, sel: Selection) -> JobHandle:
    """Exactly one selected job; JobNotFound says how many matched and how to narrow."""
    if sel.empty:
        raise UsageError("name a JOB (or select one with --tag/--group/--state)", obj="JOB")
    if len(sel.idents) == 1:
        return next(select(ws, sel))  # its own error names the ident
    found = list(select(ws, sel))
    if len(found) == 1:
        return found[0]
    what = " ".join([*sel.idents, sel.narrowing()]).strip() or "--all"
    if not found:
        raise JobNotFound("matches no job", obj=f"selection {what}", hint="see `flow list`")
    shown = ", ".join(h.key for h in found[:5]) + (", ..." if len(found) > 5 else "")
    raise JobNotFound(
        f"matches {len(found)} jobs ({shown})",
        obj=f"selection {what}",
        hint="narrow with --state/--tag/--group, or give the job's key",
    )


def resolve_after(ws: Workspace, text: str) -> list[JobHandle]:
    """The jobs of a dependency selector: `group:NAME`, `tag:NAME`, `job:IDENT`, or a bare
    word tried as a job ident (id, 8+ hex prefix, key), then a group, then a tag."""
    kind, colon, value = text.strip().partition(":")
    if colon:
        if kind == "group":
            found = list(select(ws, Selection(groups=(value,))))
        elif kind == "tag":
            found = list(select(ws, Selection(tags=(names.check_tag(value),))))
        elif kind == "job":
            found = list(select(ws, Selection(idents=(value,))))
        else:
            raise UsageError(
                f"has an unknown kind {kind!r}",
                obj=f"selector {text!r}",
                hint="write group:NAME, tag:NAME, job:IDENT, or a bare job id, group or tag",
            )
        if not found:
            raise JobNotFound("matches no job", obj=f"selector {text!r}")
        return found
    word = kind
    by_id = ident_matches(ws, word, tags=False)
    if len(by_id) > 1:
        raise not_one(ws, word, by_id)
    if by_id:
        return by_id
    is_group = names.TAG_RE.fullmatch(word) is not None and GroupRegistry(ws).find(word) is not None
    tagged = (
        [h for h in all_jobs(ws) if h.marker.tag == word] if names.TAG_RE.fullmatch(word) else []
    )
    if is_group and tagged:
        raise UsageError(
            "is both a group and a tag",
            obj=f"selector {text!r}",
            hint=f"write group:{word} or tag:{word}",
        )
    if is_group:
        found = list(select(ws, Selection(groups=(word,))))
    else:
        found = list({h.key: h for h in tagged}.values())
    if not found:
        raise JobNotFound(
            "matches no job, group or tag",
            obj=f"selector {text!r}",
            hint="see the jobs with `flow list` and the groups with `flow groups`",
        )
    return found
