"""A manager (in this process) serving a workspace whose job definitions hypothesis
replaced with garbage after submission: it runs to idle without an exception, fails each
broken job with a reason, and the good job beside them succeeds."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from helpers import serve_in_process
from hypothesis import given
from hypothesis import strategies as st

from httk_flow.protocol import jobs
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

from .tally import tried
from .test_fuzz_parsers import VALID_JOB, fuzz, values

BROKEN = 6
#: members whose garbage could still make a runnable job (a random command) stay intact
MUTABLE = sorted(set(VALID_JOB) - {"program", "args"})

definitions = st.one_of(
    st.binary(max_size=200).map(lambda b: ("raw", b)),
    values.map(lambda v: ("raw", json.dumps(v).encode())),
    st.tuples(st.sampled_from(MUTABLE), values, st.booleans()).map(lambda t: ("mutate", t)),
)


def _plant(path: str, how: tuple[str, Any]) -> None:
    kind, what = how
    if kind == "raw":
        data = what
    else:
        key, value, drop = what
        with open(path, "rb") as fh:
            d = json.loads(fh.read())
        if drop:
            d.pop(key, None)
        else:
            d[key] = value
        data = json.dumps(d).encode()
    with open(path, "wb") as fh:
        fh.write(data)


@fuzz(4)
@given(st.lists(definitions, min_size=BROKEN, max_size=BROKEN))
def test_a_manager_serves_on_through_fuzzed_definitions(how: list[tuple[str, Any]]) -> None:
    tried("job.json under a running manager", len(how))
    d = tempfile.mkdtemp(prefix="fuzz-manager-")
    try:
        prog = os.path.join(d, "ok.sh")
        with open(prog, "w") as fh:
            fh.write("#!/bin/sh\nexit 0\n")
        os.chmod(prog, 0o755)
        ws = Workspace.create(os.path.join(d, "ws"))
        specs = list(Submitter(ws).submit([SubmitRequest(program=prog) for _ in range(BROKEN + 1)]))
        good, broken = specs[0], specs[1:]
        for spec, h in zip(broken, how, strict=True):
            _plant(os.path.join(ws.job_dir(spec.placement, spec.key), "job.json"), h)
        _, rc = serve_in_process(ws)
        assert rc in (0, 1)
        final = {h.job_id: h for h in jobs.all_jobs(ws)}
        assert final[good.id].state is State.SUCCEEDED
        for spec in broken:
            h = final[spec.id]
            assert not h.state.is_active and h.state is not State.SUBMITTED, h
            frame = ws.reader.read(h.marker.ref)
            if h.state is State.FAILED and "attempt" not in frame:
                assert frame["failure"]["code"] == "protocol_error"
                assert "job.json" in frame["failure"]["message"] or "program" in str(frame)
        ws.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
