"""The grammar of every name that becomes a path: ids, keys, placements, markers, refs.

parse/format here are the only code that knows the marker file-name grammar.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import uuid
from dataclasses import dataclass, field

from httk_flow.errors import InvalidName
from httk_flow.protocol.layout import JOB_INTERNALS, is_attempt_name
from httk_flow.protocol.layout import attempt_name as attempt_name  # re-exported from layout

_ID = r"[0-9a-f]{32}"
_TAG = r"[A-Za-z0-9][A-Za-z0-9_+-]{0,63}"
_WRITER = r"[a-z0-9]{1,24}"
_B36 = r"(?:0|[1-9a-z][0-9a-z]{0,12})"  # canonical: one spelling per number
#: base-36 digits of a group digest (the marker's `s` field, protocol.md §2)
GROUP_DIGEST_LEN = 8
ID_RE = re.compile(_ID)
TAG_RE = re.compile(_TAG)
KEY_RE = re.compile(rf"(?:(?P<tag>{_TAG})--)?(?P<id>{_ID})")
WRITER_RE = re.compile(_WRITER)
REF_RE = re.compile(rf"(?P<writer>{_WRITER})-(?P<seg>{_B36})-(?P<off>{_B36})")
#: the not-before and class fields, adjacent in a marker name: ready jobs are counted by them
_CLS_FIELD = r"(?:\.c(?P<cls>[0-9a-z]{1,16})|)"
_NB_CLS = rf"(?:\.t(?P<nb>[1-9a-z][0-9a-z]{{0,12}})|){_CLS_FIELD}"
#: The key tries the untagged form first (with `(?:TAG--)?ID`, the tag's repetition takes
#: the 32 digits of an untagged key and gives them back one at a time), and an optional
#: field is `(?:...|)`, not `(?:...)?`: the same language and groups, cheaper to match.
MARKER_RE = re.compile(
    rf"(?P<key>{_ID}|{_TAG}--{_ID})\.p(?P<prio>[0-9]{{3}})\.g(?P<gen>{_B36}){_NB_CLS}"
    rf"(?:\.s(?P<grp>[0-9a-z]{{{GROUP_DIGEST_LEN}}})|)(?:(?P<aft>\.a)|)"
    rf"\.(?P<ref>{_WRITER}-{_B36}-{_B36})"
)
#: the not-before and class fields as a marker name spells them (what marker_scan("nb_cls")
#: captures, "" included): groups() == (nb, cls)
NB_CLS_RE = re.compile(_NB_CLS)
#: what separates the names of the text marker_scan searches: no file name can hold it
SCAN_SEP = "/"
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,127}")
#: deepest placement accepted; deeper trees only slow every scan down
MAX_PLACEMENT_DEPTH = 16
MAX_PLACEMENT_LEN = 512
#: the longest job key: a 64-character tag, "--" and a 32-digit id
MAX_KEY_LEN = 64 + 2 + 32
#: the ready markers of a service class lie in a subdirectory of their placement's, named
#: this and the class id (policy `class_dirs`, protocol.md §1): no placement component
#: starts with it, and a manager passes by another pool's directory without listing it
CLASS_DIR_PREFIX = "@"
#: a marker is born inside its job's payload under this prefix and moved out by one rename,
#: so only one actor can ever publish it (protocol.md §6)
BIRTH_PREFIX = ".birth."
MAX_PRIORITY = 999
DEFAULT_PRIORITY = 500


_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"
#: every two-digit string, so a name's numbers take half the divisions (hot: markers)
_PAIRS36 = [a + b for a in _DIGITS36 for b in _DIGITS36]


def to36(n: int) -> str:
    """Non-negative int to lower-case base 36."""
    if n < 36:
        if n < 0:
            raise ValueError("negative")
        return _DIGITS36[n]
    out = ""
    while n >= 36:
        n, r = divmod(n, 1296)
        out = _PAIRS36[r] + out
    return out.lstrip("0") if n == 0 else _DIGITS36[n] + out


def from36(s: str) -> int:
    return int(s, 36)


def new_id() -> str:
    return uuid.uuid4().hex


def make_key(job_id: str, tag: str | None) -> str:
    return f"{tag}--{job_id}" if tag else job_id


def check_tag(tag: str) -> str:
    if not TAG_RE.fullmatch(tag):
        raise InvalidName(
            "a tag is 1-64 characters of letters, digits, '_', '+' and '-', "
            "starting with a letter or digit",
            obj=f"tag {tag!r}",
        )
    return tag


def check_group(name: str) -> str:
    """A group name: the tag grammar (it is shown and typed like a tag)."""
    if not TAG_RE.fullmatch(name):
        raise InvalidName(
            "a group name is 1-64 characters of letters, digits, '_', '+' and '-', "
            "starting with a letter or digit",
            obj=f"group {name!r}",
        )
    return name


def group_digest(name: str) -> str:
    """The fixed-length digest a marker carries for its group (protocol.md §2)."""
    n = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 36**GROUP_DIGEST_LEN
    return to36(n).rjust(GROUP_DIGEST_LEN, "0")


def check_ident(value: str, what: str) -> str:
    """Step names and parameter keys: they become bash function and variable names."""
    if not IDENT_RE.fullmatch(value):
        raise InvalidName(
            f"a {what} is 1-64 characters of letters, digits and '_', not starting with a digit",
            obj=f"{what} {value!r}",
        )
    return value


def check_label(value: str, what: str = "label") -> str:
    """Pools, capabilities and child labels: plain words, safe in a file name."""
    if not LABEL_RE.fullmatch(value):
        raise InvalidName(
            f"a {what} is 1-128 characters of letters, digits and '_.+-', "
            "starting with a letter or digit",
            obj=f"{what} {value!r}",
        )
    return value


def check_placement(placement: str) -> str:
    """A relative path of safe components; never absolute, never '..', never under .flow."""
    obj = f"placement {placement!r}"
    if "\0" in placement:
        raise InvalidName("contains a NUL byte", obj=obj)
    p = placement.strip("/")
    if placement.startswith("/"):
        raise InvalidName("must be a relative path inside the workspace", obj=obj)
    if not p:
        raise InvalidName("is empty", obj=obj)
    if len(p) > MAX_PLACEMENT_LEN:
        raise InvalidName(f"is longer than {MAX_PLACEMENT_LEN} characters", obj=obj)
    parts = p.split("/")
    if len(parts) > MAX_PLACEMENT_DEPTH:
        raise InvalidName(f"is deeper than {MAX_PLACEMENT_DEPTH} directories", obj=obj)
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidName("has an empty, '.' or '..' component", obj=obj)
        if not _COMPONENT_RE.fullmatch(part):
            raise InvalidName(
                f"component {part!r} must be 1-128 characters of letters, digits and "
                "'_.+=@,-', not starting with '.' or '-'",
                obj=obj,
            )
    return p


def check_parent_placement(placement: str) -> str:
    """A placement a user may submit to: its jobs' children live one level below it
    (`<placement>/<key>`), so it must leave room for that level."""
    p = check_placement(placement)
    obj = f"placement {placement!r}"
    if p.count("/") + 1 > MAX_PLACEMENT_DEPTH - 1:
        raise InvalidName(
            f"has {p.count('/') + 1} components; a job's children live one level below it, "
            f"so a submitted placement has at most {MAX_PLACEMENT_DEPTH - 1}",
            obj=obj,
        )
    parts = p.split("/")
    for key, inner in itertools.pairwise(parts):
        # a job's own files, workdir or attempt directories: never another job's home
        if KEY_RE.fullmatch(key) and (inner in JOB_INTERNALS or is_attempt_name(inner)):
            raise InvalidName(
                f"lies inside the {inner}/ of job {key}, which only that job may use; "
                "place jobs in a directory of their own (a job's children are placed "
                "inside it by flow)",
                obj=obj,
            )
    room = MAX_PLACEMENT_LEN - 1 - MAX_KEY_LEN
    if len(p) > room:
        raise InvalidName(
            f"is {len(p)} characters; a job's children live under <placement>/<key>, so a "
            f"submitted placement has at most {room}",
            obj=obj,
        )
    return p


def default_placement(job_id: str) -> str:
    """Shard by id: 256 shards keep every directory under 4,000 jobs at a million, and an
    idle scan of a state kind costs 256 directory reads, not thousands."""
    return f"jobs/{job_id[:2]}"


@dataclass(frozen=True, slots=True)
class JobKey:
    """`[<tag>--]<id>`: the job directory's name and the marker's first field."""

    id: str
    tag: str | None

    @classmethod
    def parse(cls, text: str) -> JobKey:
        m = KEY_RE.fullmatch(text)
        if not m:
            raise InvalidName("is not a job key ([<tag>--]<32 hex digits>)", obj=repr(text))
        return cls(m.group("id"), m.group("tag"))

    def __str__(self) -> str:
        return make_key(self.id, self.tag)


@dataclass(frozen=True, slots=True, order=True)
class RecordRef:
    """Where a journal frame lives: writer id, segment number, byte offset."""

    writer: str
    segment: int
    offset: int
    #: the text, built once: a marker's name and the next frame's `prev` both spell it
    _text: str = field(default="", init=False, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> RecordRef:
        m = REF_RE.fullmatch(text)
        if not m:
            raise InvalidName("is not a record reference", obj=repr(text))
        return cls(m.group("writer"), from36(m.group("seg")), from36(m.group("off")))

    def __str__(self) -> str:
        if not self._text:
            text = f"{self.writer}-{to36(self.segment)}-{to36(self.offset)}"
            object.__setattr__(self, "_text", text)
        return self._text


@dataclass(frozen=True, slots=True)
class Marker:
    """A parsed marker file name:
    `<key>.p<prio>.g<gen>[.t<not-before>][.c<class>][.s<group digest>].<ref>`.

    The class names the job's pool and required capabilities (.flow/classes/<class>.json),
    so claiming and `flow status` can tell who may serve a job without opening it; the
    group digest (.flow/groups/<digest>.json) lets a selection by group read names only.
    """

    key: str
    priority: int
    generation: int
    ref: RecordRef
    not_before: int = 0  # unix seconds; 0 = claimable now
    service: str = ""  # service class; "" = any manager of the default pool
    group_digest: str = ""  # the job's group; "" = none (and every marker before groups)
    #: `.a`: the job waits for dependencies not yet met (protocol.md §14), so the join
    #: scan passes it by its name alone
    after: bool = False
    #: the file name, built once: every path of the marker needs it (init=False, so
    #: dataclasses.replace never carries a stale one over)
    _name: str = field(default="", init=False, compare=False, repr=False)

    @classmethod
    def from_name(cls, name: str) -> Marker:
        marker = cls.parse_or_none(name)
        if marker is None:
            raise InvalidName("is not a marker name of the grammar", obj=repr(name))
        return marker

    @classmethod
    def parse_or_none(cls, name: str) -> Marker | None:
        """One regular-expression match per name: this runs for every entry of every scan."""
        m = MARKER_RE.fullmatch(name)
        if m is None:
            return None
        key, prio, gen, nb, service, grp, aft, ref = m.group(
            "key", "prio", "gen", "nb", "cls", "grp", "aft", "ref"
        )
        writer, seg, off = ref.split("-")  # the grammar already checked each part
        rref = RecordRef(writer, int(seg, 36), int(off, 36))
        object.__setattr__(rref, "_text", ref)  # canonical too: the next frame's `prev`
        marker = cls(
            key,
            int(prio),
            int(gen, 36),
            rref,
            int(nb, 36) if nb else 0,
            service or "",
            grp or "",
            aft is not None,
        )
        object.__setattr__(marker, "_name", name)  # the grammar is canonical: one spelling
        return marker

    @property
    def name(self) -> str:
        if not self._name:
            nb = f".t{to36(self.not_before)}" if self.not_before else ""
            c = f".c{self.service}" if self.service else ""
            g = f".s{self.group_digest}" if self.group_digest else ""
            a = ".a" if self.after else ""
            gen = to36(self.generation)
            name = f"{self.key}.p{self.priority:03d}.g{gen}{nb}{c}{g}{a}.{self.ref}"
            object.__setattr__(self, "_name", name)
        return self._name

    @property
    def job_id(self) -> str:
        return self.key[-32:]

    @property
    def tag(self) -> str | None:
        return self.key[:-34] if len(self.key) > 32 else None

    def successor(
        self,
        ref: RecordRef,
        *,
        priority: int | None = None,
        not_before: int = 0,
        after: bool = False,
    ) -> Marker:
        """The next marker of this job: one generation on, pointing at a new record."""
        return Marker(
            key=self.key,
            priority=self.priority if priority is None else priority,
            generation=self.generation + 1,
            ref=ref,
            not_before=not_before,
            service=self.service,
            group_digest=self.group_digest,
            after=after,
        )


def class_dir(service: str) -> str:
    """The name of the directory that holds the ready markers of class `service`."""
    return f"{CLASS_DIR_PREFIX}{service}"


def dir_class(name: str) -> str | None:
    """The class whose ready markers a directory of this name holds (None: it is no class
    directory, but a placement's)."""
    return name[1:] if name.startswith(CLASS_DIR_PREFIX) else None


def marker_service(name: str) -> str:
    """The service class field of a marker name ("" = the default class), read without
    parsing the rest: scans use it to pass by other pools' markers cheaply.

    Only the class field starts with `.c` and is followed by another field (the ref is
    last and a key holds no dot); a name off the grammar gives an answer that means
    nothing, so callers still parse the names they keep."""
    i = name.find(".c")
    if i < 0:
        return ""
    j = name.find(".", i + 2)
    return "" if j < 0 else name[i + 2 : j]


@functools.cache
def marker_scan(capture: str | None = None, *, unclassed: bool = False) -> re.Pattern[str]:
    """MARKER_RE for finding the markers among many names with one search, not one match
    per name: the text searched is SCAN_SEP, the names joined by it, and SCAN_SEP again,
    and each match is one whole name of the grammar. No file name holds SCAN_SEP, so no
    name can make a match that runs into the next one (a newline could: names hold any
    character but "/" and NUL).

    `capture`: the match's one group, "nb_cls" (the not-before and class fields as the
    name spells them, "" for neither: NB_CLS_RE reads them) or a group of MARKER_RE; None:
    no group. Every class of several ranges also holds NUL, which no file name holds: then
    CPython tests the class as a bitmap, one step per character instead of one per range.
    `unclassed`: only the markers of the default class (no class field).
    Built on first use (most commands never count markers)."""
    nb_cls = _NB_CLS.replace(_CLS_FIELD, "") if unclassed else _NB_CLS
    pattern = MARKER_RE.pattern.replace(_NB_CLS, f"(?P<nb_cls>{nb_cls})")
    pattern = re.sub(r"\(\?P<(\w+)>", lambda m: "(" if m[1] == capture else "(?:", pattern)
    for chars in ("0-9a-f", "0-9a-z", "1-9a-z", "a-z0-9"):
        pattern = pattern.replace(f"[{chars}]", f"[\\x00{chars}]")
    sep = re.escape(SCAN_SEP)
    scan = re.compile(f"{sep}(?:{pattern})(?={sep})")
    if scan.groups != (capture is not None):
        raise ValueError(f"no group {capture!r} in the marker grammar")
    return scan


def check_priority(value: int) -> int:
    if not 0 <= value <= MAX_PRIORITY:
        raise InvalidName(f"priority {value} is outside 0-{MAX_PRIORITY}", obj="priority")
    return value
