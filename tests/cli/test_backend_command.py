"""Commands a backend adds are plain descriptions (scale.backends.base.BackendCommand); the
CLI builds them (cli/cmd_alloc.backend_command), and the package owns the wait by token."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from httk_flow.cli.main import cli
from httk_flow.errors import FlowError
from httk_flow.scale import backends
from httk_flow.scale.backends.base import (
    BackendCommand,
    BackendUnavailable,
    Submitted,
    adopt_by_token,
)


class FakeSubmit:
    def __init__(self, fail: FlowError | None = None) -> None:
        self.calls: list[dict[str, object]] = []
        self.fail = fail

    def __call__(
        self,
        workspace: str,
        *,
        serve_args: tuple[str, ...],
        time: float | None,
        drain: float,
        extra_args: tuple[str, ...],
    ) -> Submitted:
        self.calls.append(
            {"serve_args": serve_args, "time": time, "drain": drain, "extra_args": extra_args}
        )
        if self.fail is not None:
            raise self.fail
        return Submitted(handle="77", token="atok", workspace=workspace, log="/logs/77.out")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSubmit:
    submit = FakeSubmit()
    spec = BackendCommand(
        name="submit-one",
        help="Submit one allocation by hand.\n\nMore words.",
        arg_flag="--batch-arg",
        arg_help="Passed on as it is.",
        submit=submit,
    )
    monkeypatch.setattr(backends, "commands", lambda: [spec])
    return submit


def test_a_backend_command_is_listed_and_built_from_its_description(
    runner: CliRunner, fake: FakeSubmit
) -> None:
    assert "submit-one   Submit one allocation by hand." in runner.invoke(cli, ["--help"]).stdout
    out = runner.invoke(cli, ["submit-one", "--help"]).stdout
    assert "More words." in out and "--batch-arg ARG" in out and "[-- SERVE_OPTIONS]" in out


def test_it_passes_the_parsed_options_and_prints_the_handle(
    runner: CliRunner, ws: str, fake: FakeSubmit
) -> None:
    argv = ["submit-one", "-w", ws, "--batch-arg", "-p", "--batch-arg=x", "--time", "1h"]
    r = runner.invoke(cli, [*argv, "--", "--pool", "gpu"])
    assert (r.exit_code, r.stdout) == (0, "77\n")
    assert fake.calls == [
        {"serve_args": ("--pool", "gpu"), "time": 3600.0, "drain": 120.0, "extra_args": ("-p", "x")}
    ]
    r = runner.invoke(cli, ["submit-one", "-w", ws, "--json"])
    doc = orjson.loads(r.stdout)
    assert doc.pop("workspace").endswith("/ws")
    assert doc == {"job_id": "77", "token": "atok", "log": "/logs/77.out"}


def test_serve_options_are_checked_as_flow_serve_would_before_submitting(
    runner: CliRunner, ws: str, fake: FakeSubmit
) -> None:
    r = runner.invoke(cli, ["submit-one", "-w", ws, "--", "--xyzzy"])
    assert r.exit_code == 2
    assert r.stderr == (
        "flow: error: SERVE_OPTIONS: are not options of `flow serve`: No such option '--xyzzy'.\n"
    )
    r = runner.invoke(cli, ["submit-one", "-w", ws, "--", "-w", "elsewhere"])
    assert r.stderr == "flow: error: SERVE_OPTIONS: may not name a workspace; pass -w before --\n"
    assert fake.calls == []


def test_a_refusal_from_the_backend_is_one_error_line(
    runner: CliRunner, ws: str, fake: FakeSubmit
) -> None:
    fake.fail = FlowError("no", obj="flow submit-one", hint="check the --batch-arg values")
    r = runner.invoke(cli, ["submit-one", "-w", ws])
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == "flow: error: flow submit-one: no; check the --batch-arg values\n"


class Answers:
    """find_by_token answering from a list; BackendUnavailable entries are raised."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked = 0

    def find_by_token(self, workspace: str, token: str) -> str | None:
        self.asked += 1
        a = self.answers.pop(0) if self.answers else None
        if isinstance(a, BaseException):
            raise a
        return a  # type: ignore[return-value]


def test_adoption_asks_by_token_until_found_or_the_wait_is_over() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    down = BackendUnavailable("no answer")
    found = Answers(down, None, "42")
    got = adopt_by_token(found, "/ws", "t", 10.0, clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    assert (got, found.asked, now[0]) == ("42", 3, 4.0)
    never = Answers(down)
    now[0] = 0.0
    got = adopt_by_token(never, "/ws", "t", 10.0, clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    assert (got, never.asked, now[0]) == (None, 6, 10.0)
