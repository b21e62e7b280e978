"""job.json's time limit and its factor: parsed, validated, written only when set, and the
limit (and the time request) an attempt gets after attempts that reached theirs."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from httk_flow.errors import InvalidJob
from httk_flow.protocol.jobspec import MAX_SECONDS, JobSpec, duration_words

JOB_ID = "0123456789abcdef0123456789abcdef"


def spec_of(**members: object) -> JobSpec:
    doc: dict[str, object] = {
        "id": JOB_ID,
        "key": JOB_ID,
        "program": {"command": "true"},
        "placement": "jobs/01",
        **members,
    }
    return JobSpec.from_json(orjson.dumps(doc), "job.json")


def test_a_job_json_without_a_limit_has_none_and_factor_one() -> None:
    spec = spec_of(time=60)
    assert (spec.time_limit, spec.time_limit_factor) == (None, 1.0)
    assert spec.time_limit_after(5) is None
    assert spec.time_request_after(5) == 60.0  # no factor: the request stays
    assert "time_limit" not in spec.to_dict()


def test_the_limit_and_the_request_grow_by_the_factor_for_each_attempt_that_reached_it() -> None:
    spec = spec_of(time=30, time_limit=60, time_limit_factor=2)
    assert [spec.time_limit_after(n) for n in range(4)] == [60.0, 120.0, 240.0, 480.0]
    assert [spec.time_request_after(n) for n in range(3)] == [30.0, 60.0, 120.0]
    back = JobSpec.from_json(spec.to_json(), "job.json")
    assert back == spec and back.to_dict()["time_limit_factor"] == 2.0


@given(st.integers(min_value=0, max_value=10**6), st.floats(min_value=1, max_value=100))
def test_a_grown_limit_stops_at_ten_years_and_never_overflows(n: int, factor: float) -> None:
    spec = spec_of(time_limit=1, time_limit_factor=factor)
    limit = spec.time_limit_after(n)
    assert limit is not None and 1 <= limit <= MAX_SECONDS


@pytest.mark.parametrize(
    "members",
    [
        {"time_limit": 0},
        {"time_limit": -5},
        {"time_limit": "1h"},
        {"time_limit": MAX_SECONDS},
        {"time_limit": 60, "time_limit_factor": 0.5},
        {"time_limit": 60, "time_limit_factor": 101},
        {"time_limit": 60, "time_limit_factor": True},
        {"time": 120, "time_limit": 60},
    ],
    ids=repr,
)
def test_a_bad_limit_or_factor_makes_job_json_invalid(members: dict[str, object]) -> None:
    with pytest.raises(InvalidJob):
        spec_of(**members)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(2, "2s"), (1.5, "1.5s"), (59, "59s"), (60, "1m"), (90, "1m30s"), (5400, "1h30m")],
)
def test_durations_are_said_as_users_write_them(seconds: float, words: str) -> None:
    assert duration_words(seconds) == words
    assert duration_words(86400 * 2) == "2d"
