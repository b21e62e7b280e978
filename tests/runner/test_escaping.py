"""Arbitrary strings survive flow.sh's pure-bash JSON escaping and flow_param unchanged.

Each hypothesis example is a batch of strings handled by one bash process; a few batches
also go through a real manager and are read back from the journal.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from httk_flow.protocol.outcome import MAX_MESSAGE, read_outcome

from .support import Bench, bash

#: any text but NUL, which neither a bash string nor an environment variable can hold
TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))
#: the characters JSON must escape, and their neighbours, much more often than text() would
NASTY = st.text(st.sampled_from(['"', "\\", "\n", "\t", "\r", "\x01", "\x1f", "\x7f", "é", "☃"]))
BATCH = st.lists(st.one_of(TEXT, NASTY), min_size=1, max_size=40)

#: strings chosen to break naive escaping
SAMPLES = [
    "",
    "plain",
    'say "hi"',
    "back\\slash \\n not a newline",
    "line\nbreak\r\n and\ttab",
    "".join(chr(c) for c in range(1, 32)),
    "\x7f del",
    "ünïcödé ☃ 𝄞 中文",
    "& and \\& and $HOME and `date` and $(id)",
    "'single' quotes",
    " leading and trailing spaces ",
    "trailing newlines\n\n",
    "%s %d %% printf",
    "\\u0041 stays literal",
]


def _nul_joined(strings: list[str]) -> bytes:
    return b"".join(s.encode() + b"\0" for s in strings)


@settings(max_examples=60)
@given(BATCH)
def test_json_quote_round_trips_any_string(strings: list[str]) -> None:
    # the escaping is in flow-more.sh, which flow.sh reads on first need
    script = """
        _flow_load || exit 3
        while IFS= read -r -d '' s; do
            _flow_json_quote q "$s"
            printf '%s\\n' "$q"
        done
    """
    done = bash(script, stdin=_nul_joined(strings))
    assert done.stderr == b""
    lines = done.stdout.split(b"\n")[:-1]
    assert [orjson.loads(line) for line in lines] == strings


@settings(max_examples=40)
@given(BATCH)
def test_params_reach_the_program_unchanged(strings: list[str]) -> None:
    env = {f"FLOW_PARAM_p{i}": s for i, s in enumerate(strings)}
    script = f"""
        for ((i = 0; i < {len(strings)}; i++)); do
            flow_param "p$i"; printf '\\0'
            flow_param -v v "p$i"; printf '%s\\0' "$v"
        done
    """
    done = bash(script, env=env)
    assert done.stderr == b""
    values = done.stdout.split(b"\0")[:-1]
    expected = [s.encode() for s in strings for _ in (1, 2)]
    assert values == expected


@settings(max_examples=30)
@given(BATCH)
def test_succeed_messages_parse_back_to_the_same_string(strings: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(len(strings)):
            os.mkdir(os.path.join(tmp, f"a{i}"))
        script = f"""
            i=0
            while IFS= read -r -d '' s; do
                FLOW_CONTROL_DIR={tmp}/a$i
                _flow_published=0
                flow_succeed "$s"
                i=$((i + 1))
            done
        """
        done = bash(script, stdin=_nul_joined(strings))
        assert done.stderr == b""
        for i, s in enumerate(strings):
            got = read_outcome(os.path.join(tmp, f"a{i}"))
            assert got is not None and got.message == s[:MAX_MESSAGE]


# -- through a real manager ------------------------------------------------------------------

ECHO = """
flow_steps main
step_main() {
    local m
    flow_param -v m m
    flow_param m > "$FLOW_JOB_DIR/param.out"
    flow_succeed "$m"
}
flow_main
"""


def _through_manager(bench: Bench, strings: list[str]) -> None:
    prog = bench.script("echo.sh", ECHO)
    ids = bench.submit_many(prog, [{"params": {"m": s}} for s in strings])
    assert bench.run() == 0
    for ident, s in zip(ids, strings, strict=True):
        job = bench.job(ident)
        assert job.state.value == "succeeded", job.describe()
        # an empty message is not recorded in the final frame
        assert (job.message or "") == s[:MAX_MESSAGE]
        assert (job.dir / "param.out").read_bytes() == s.encode()


def test_nasty_strings_survive_a_manager_round_trip(bench: Bench) -> None:
    _through_manager(bench, [*SAMPLES, "x" * 5000])


@settings(max_examples=3)
@given(st.lists(st.one_of(TEXT, NASTY), min_size=1, max_size=8))
def test_random_strings_survive_a_manager_round_trip(strings: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        try:
            _through_manager(bench, strings)
        finally:
            bench.close()
