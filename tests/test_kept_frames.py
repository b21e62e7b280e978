"""The frames a manager keeps in memory for the claim (JournalReader.remember, protocol.md §5).

The frame that made a job ready is read back at its claim from memory, as the object the
transition serialised, not from the file: correct only if parsing the bytes the writer
placed gives that same object back. Checked here on the ready frames a real manager makes
(registration, retries after a failure, advances to a next step, parameters, arrays).
tests/test_register_batch.py shows the claim reading them from memory, and the bound.
"""

from __future__ import annotations

from pathlib import Path

from helpers import serve_in_process

from httk_flow.protocol.frames import Frame
from httk_flow.protocol.journal import JournalReader
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

#: a bash-API program whose attempts take several kinds of ready frames: by array index,
#: a plain success, a process failure retried, a retry asked for, an advance through two steps
PROGRAM = """#!/bin/bash
. "$FLOW_BASH_API"
i=${FLOW_ARRAY_INDEX:-0}
case $((i % 4)) in
0) flow_succeed "plain ünïcode \\"quoted\\" $(flow_param label)" ;;
1) if [[ $FLOW_ATTEMPT == 1 ]]; then echo "first try fails: $i" >&2; exit 3; fi; flow_succeed ;;
2) if [[ $FLOW_ATTEMPT == 1 ]]; then flow_retry "again, please"; else flow_succeed; fi ;;
3) case $FLOW_STEP in
   main) flow_advance second "to the second step" ;;
   *) flow_succeed "done at $FLOW_STEP" ;;
   esac ;;
esac
"""


def test_every_kept_ready_frame_is_what_its_bytes_parse_to(tmp_path: Path) -> None:
    prog = tmp_path / "prog.sh"
    prog.write_text(PROGRAM)
    prog.chmod(0o755)
    ws = Workspace.create(str(tmp_path / "ws"))
    kept: list[tuple[RecordRef, Frame]] = []
    reader = ws.reader
    remember = reader.remember

    def spy(ref: RecordRef, frame: Frame) -> None:
        kept.append((ref, frame))
        remember(ref, frame)

    reader.remember = spy  # type: ignore[method-assign]
    reqs = [
        SubmitRequest(
            program=str(prog),
            array_index=i,
            params={"label": f"job {i}", "n": i, "x": 1.5, "on": i % 2 == 0},
            priority=400 + i,
            retries=2,
        )
        for i in range(12)
    ]
    list(Submitter(ws).submit(reqs))
    _, rc = serve_in_process(ws)
    assert rc == 0
    kinds = {(f.source, f.to) for _, f in kept}
    # registration, the retries (a failure and a retry asked for) and the advance
    assert (State.SUBMITTED, State.READY) in kinds
    assert any(f.snap.last is not None and f.to is State.READY for _, f in kept)
    assert any(f.snap.step == "second" for _, f in kept)
    assert len(kept) >= 12 + 3 + 3 + 3
    fresh = JournalReader(ws.journal_dir)  # a reader with nothing kept: the file only
    try:
        for ref, frame in kept:
            assert Frame.from_json(fresh.read(ref)) == frame, ref
            assert reader.frame(ref) is frame  # and the claim's reader returned it kept
    finally:
        fresh.close()
        ws.close()
