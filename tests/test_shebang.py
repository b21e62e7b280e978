"""A program's #! line: what an exec that found no interpreter is told, in its words."""

from __future__ import annotations

from pathlib import Path

import pytest

from httk_flow.errors import UsageError
from httk_flow.protocol.shebang import (
    check_runnable,
    interpreter_line,
    missing_interpreter,
    words,
)


def test_the_line_is_the_first_one_without_its_hash_bang() -> None:
    assert interpreter_line(b"#!/bin/sh -e\necho\n") == "/bin/sh -e"
    assert interpreter_line(b"#!/bin/bash\r\n") == "/bin/bash\r"
    assert interpreter_line(b"#!" + b"x" * 400) == "x" * 254  # the kernel reads 256 bytes
    assert interpreter_line(b"echo hi\n") is None
    assert interpreter_line(b"") is None
    # split as the kernel does: spaces and tabs only, a carriage return kept in the name
    assert words(" /usr/bin/env \tbash  -x") == ["/usr/bin/env", "bash", "-x"]
    assert words("/bin/bash\r") == ["/bin/bash\r"]


def test_a_missing_interpreter_is_named_from_the_programs_own_line(tmp_path: Path) -> None:
    def said(content: bytes) -> str:
        p = tmp_path / "prog"
        p.write_bytes(content)
        return missing_interpreter(str(p))

    assert said(b"#!/usr/bin/pyhton3 -u\n") == "its #! interpreter '/usr/bin/pyhton3' was not found"
    assert said(b"#!/bin/bash\r\necho\r\n") == (
        "its #! line ends in a carriage return (the file was saved with Windows line "
        "endings: convert it with dos2unix)"
    )
    assert said(b"#!\n") == "its #! interpreter was not found"
    assert missing_interpreter(str(tmp_path / "gone")) == "its #! interpreter was not found"
    assert missing_interpreter("") == "its #! interpreter was not found"


def test_only_a_carriage_return_on_the_hash_bang_line_is_refused() -> None:
    check_runnable(b"#!/bin/sh\necho a\r\n", "ok.sh")
    check_runnable(b"echo a\r\n", "bare.sh")
    with pytest.raises(UsageError) as info:
        check_runnable(b"#!/bin/sh\r\n", "my prog.sh")
    assert info.value.obj == "program 'my prog.sh'"
    assert "dos2unix 'my prog.sh'" in str(info.value)
