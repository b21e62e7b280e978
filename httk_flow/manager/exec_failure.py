"""What a program the launcher could not execute means for its job: a failure code and a
message naming the program as the user knows it (docs/protocol.md §9)."""

from __future__ import annotations

import os

from httk_flow.manager.launcher import NOT_FOUND
from httk_flow.protocol.jobspec import Program
from httk_flow.protocol.shebang import missing_interpreter


def exec_failure(program: Program, where: str, word: str, by_exec: bool) -> tuple[str, str]:
    """(code, message) for the launcher's `word` (NOT_FOUND or NOT_EXECUTABLE) about
    `where`, the path or name it tried; `by_exec`: the exec itself failed."""
    code = "program_not_found" if word == NOT_FOUND else "program_not_executable"
    if program.command:
        what = f"the command {program.command!r}"
    elif program.bundle:
        what = f"the program {program.path!r} of bundle {program.bundle} (at {where})"
    elif program.in_place:
        what = f"the in-place program {where}"
    else:
        what = f"the program {program.name or where!r} (stored as {where})"
    if by_exec:
        if word != NOT_FOUND:
            why = "its #! interpreter is not executable, or it is not a program"
        elif os.path.isabs(where):
            why = missing_interpreter(where)
        else:  # a command's file is found on the attempt's PATH, not ours to search
            why = "its #! interpreter was not found"
        return code, f"{what} could not be executed: {why}; it was not retried"
    if word == NOT_FOUND:
        found = "was not found on the attempt's PATH" if program.command else "was not found"
        return code, f"{what} {found}; it was not retried"
    return code, f"{what} is not an executable file; it was not retried"
