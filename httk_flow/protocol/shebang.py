"""A program's #! line, read to refuse a program that cannot run anywhere and to name the
interpreter that an exec could not find."""

from __future__ import annotations

import shlex

from httk_flow.errors import UsageError

#: the kernel reads at most this much of a program for its #! line
LINE_MAX = 256


def interpreter_line(head: bytes) -> str | None:
    """The #! line of a program whose first bytes are `head`, without `#!` and the newline
    (a carriage return before the newline kept); None when the program has none."""
    if not head.startswith(b"#!"):
        return None
    return head[2:LINE_MAX].split(b"\n", 1)[0].decode(errors="replace")


def words(line: str) -> list[str]:
    """The words of a #! line as the kernel splits them: by spaces and tabs only (a
    carriage return of a file saved on Windows is part of the interpreter's name)."""
    return [w for w in line.replace("\t", " ").split(" ") if w]


def read_line(path: str) -> str | None:
    """interpreter_line of the file at `path`; None also when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return interpreter_line(fh.read(LINE_MAX))
    except OSError:
        return None


def saved_with_crlf(line: str) -> bool:
    """A #! line saved with Windows line endings: the kernel (and env) look for an
    interpreter whose name ends in a carriage return, which no system has."""
    return line.endswith("\r")


def check_runnable(head: bytes, path: str) -> None:
    """Refuse at submission a program whose #! line ends in a carriage return: every
    attempt would fail as `not found`, far from the editor that saved it."""
    line = interpreter_line(head)
    if line is not None and saved_with_crlf(line):
        q = shlex.quote(path)
        raise UsageError(
            f"has Windows line endings: its #! line ({line.strip()!r}) ends in a carriage "
            "return, so no system can find its interpreter",
            obj=f"program {path!r}",
            hint=f"convert it with `dos2unix {q}` (or `sed -i 's/\\r$//' {q}`) and submit again",
        )


def missing_interpreter(path: str) -> str:
    """Why the exec of the program at `path` found no interpreter, in the words of its #!
    line: which interpreter, or that the line ends in a carriage return."""
    line = read_line(path)
    named = words(line) if line is not None else []
    if not named:
        return "its #! interpreter was not found"
    if saved_with_crlf(line or ""):
        return (
            "its #! line ends in a carriage return (the file was saved with Windows line "
            "endings: convert it with dos2unix)"
        )
    return f"its #! interpreter {named[0]!r} was not found"
