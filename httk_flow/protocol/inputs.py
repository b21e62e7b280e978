"""Submission inputs: regular files and directories of them, checked and copied safely.

An input is copied into the job's `files/`. Only regular files are ever opened: a FIFO
would hang the copy, a device such as /dev/zero would fill the disk, and a socket cannot
be read at all. Symbolic links inside a directory input are copied as links (never
followed); a symbolic link given as an input is followed to the file it names.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from httk_flow.errors import UsageError

#: the inputs of one job may total this much unless the submitter raises it
DEFAULT_INPUT_MAX = 1 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_CHUNK = 1 << 20
_LIMIT_HINT = (
    "raise the limit with --input-max SIZE (e.g. --input-max 8G), or leave large data "
    "where it is and pass its path as a parameter"
)


def parse_size(text: str, what: str = "--input-max") -> int:
    """Bytes from `500M`, `2G`, `1.5GiB`, `4096` (binary units: K is 1024)."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise UsageError(
            "is not a size",
            obj=f"{what} {text!r}",
            hint="write e.g. 500M, 2G or 1.5T (K, M, G, T are powers of 1024; a plain "
            "number is bytes)",
        )
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"


def _unreadable(obj: str, e: OSError, inner: str | None = None) -> UsageError:
    where = f"holds {inner!r}, which " if inner else ""
    return UsageError(
        f"{where}cannot be read ({e.strerror})",
        obj=obj,
        hint="fix its permissions, or leave it out",
    )


def _not_regular(obj: str, mode: int, inner: str | None = None) -> UsageError:
    if inner is None:
        return UsageError(
            f"is {_kind(mode)}, not a regular file or a directory",
            obj=obj,
            hint="give a regular file (copy what the job needs into one first)",
        )
    return UsageError(
        f"holds {inner!r}, {_kind(mode)}, which is not a regular file",
        obj=obj,
        hint="remove it from the directory, or give the job's files one by one",
    )


def _past_limit(obj: str, total: int, max_bytes: int) -> UsageError:
    return UsageError(
        f"takes the job's inputs past the {human_size(max_bytes)} limit "
        f"(at least {human_size(total)})",
        obj=obj,
        hint=_LIMIT_HINT,
    )


def check_inputs(paths: list[str], max_bytes: int = DEFAULT_INPUT_MAX) -> None:
    """Refuse what copy_inputs must not copy: a missing input, two of one name, anything
    that is not a regular file (also inside a directory), more than `max_bytes` in all."""
    seen: set[str] = set()
    total = 0
    for p in paths:
        obj = f"input {p!r}"
        try:
            st = os.stat(p)  # follows a symlink given as the input: its target is copied
        except FileNotFoundError:
            if os.path.islink(p):
                raise UsageError(
                    "is a symbolic link to nothing", obj=obj, hint="give the file it should name"
                ) from None
            raise UsageError("does not exist", obj=obj, hint="check the path") from None
        except OSError as e:
            raise _unreadable(obj, e) from None
        # every input lands in files/<its name>: two of one name would overwrite each other
        base = os.path.basename(os.path.normpath(p))
        if base in seen or base in ("", ".", ".."):
            raise UsageError(
                f"would be copied to files/{base}, which another input already takes"
                if base in seen
                else "has no file name to copy it under",
                obj=obj,
                hint="rename it or put the inputs in one directory",
            )
        seen.add(base)
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode):
            total = _check_tree(p, obj, total, max_bytes)
        else:
            raise _not_regular(obj, st.st_mode)
        if total > max_bytes:
            raise _past_limit(obj, total, max_bytes)


def _check_tree(top: str, obj: str, total: int, max_bytes: int) -> int:
    """Walk a directory input (links not followed); the running total of its file sizes."""
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as e:
            raise _unreadable(obj, e, d) from None
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as err:
                raise _unreadable(obj, err, entry.path) from None
            if stat.S_ISLNK(st.st_mode):
                continue  # copied as a link, never followed nor opened
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > max_bytes:
                    raise _past_limit(obj, total, max_bytes)
            else:
                raise _not_regular(obj, st.st_mode, entry.path)
    return total


def copy_inputs(paths: list[str], dest: str, max_bytes: int = DEFAULT_INPUT_MAX) -> None:
    """Copy the inputs into `dest` (made here), opening nothing but regular files.

    What check_inputs accepted may change before the copy: a file replaced by a FIFO is
    refused without blocking, and a file that grows stops the copy at `max_bytes`.
    """
    os.mkdir(dest)
    budget = _Budget(max_bytes)
    for src in paths:
        obj = f"input {src!r}"
        target = os.path.join(dest, os.path.basename(os.path.normpath(src)))
        try:
            st = os.stat(src)
        except OSError as e:
            raise _unreadable(obj, e) from None
        if stat.S_ISDIR(st.st_mode):
            _copy_tree(src, target, obj, budget)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(src, target, obj, budget, follow=True)
        else:
            raise _not_regular(obj, st.st_mode)


class _Budget:
    """Bytes the job's inputs may still take."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def take(self, n: int, obj: str) -> None:
        self.used += n
        if self.used > self.max_bytes:
            raise _past_limit(obj, self.used, self.max_bytes)


def _copy_tree(src: str, dst: str, obj: str, budget: _Budget) -> None:
    stack = [(src, dst)]
    made: list[tuple[str, str]] = []
    while stack:
        s, d = stack.pop()
        os.mkdir(d)
        made.append((s, d))
        try:
            entries = list(os.scandir(s))
        except OSError as e:
            raise _unreadable(obj, e, s) from None
        for entry in entries:
            target = os.path.join(d, entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as err:
                raise _unreadable(obj, err, entry.path) from None
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.path), target)
            elif stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, target))
            elif stat.S_ISREG(st.st_mode):
                _copy_file(entry.path, target, obj, budget, follow=False, inner=entry.path)
            else:
                raise _not_regular(obj, st.st_mode, entry.path)
    # directory modes and times last (as a tree copy does), once their contents are in
    for s, d in reversed(made):
        try:
            st = os.stat(s)
            os.chmod(d, stat.S_IMODE(st.st_mode))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            pass


def _copy_file(
    src: str, dst: str, obj: str, budget: _Budget, *, follow: bool, inner: str | None = None
) -> None:
    # O_NONBLOCK: a FIFO swapped in after the check opens at once instead of waiting for a
    # writer; O_NOFOLLOW inside a directory, whose links are copied as links, never read
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fin = os.open(src, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # now a link, or a socket
            raise UsageError(
                f"{f'holds {inner!r}, which ' if inner else ''}changed while it was copied "
                "(it is no longer a regular file)",
                obj=obj,
                hint="submit again once it stays put",
            ) from None
        raise _unreadable(obj, e, inner) from None
    try:
        st = os.fstat(fin)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(obj, st.st_mode, inner)
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _pump(fin, fout, obj, budget)
            os.fchmod(fout, stat.S_IMODE(st.st_mode))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _pump(fin: int, fout: int, obj: str, budget: _Budget) -> None:
    """Copy to the end of `fin`, never past the budget (a file may grow while copied)."""
    while True:
        room = budget.max_bytes - budget.used
        data = os.read(fin, min(_CHUNK, room + 1))
        if not data:
            return
        budget.take(len(data), obj)
        view = memoryview(data)
        while view:
            view = view[os.write(fout, view) :]
