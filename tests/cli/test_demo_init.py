"""CLI tests of `flow demo` on a directory that already holds the demo, and of `flow init`
inside another workspace's tree: whole outputs (stdout and stderr apart) and exit codes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from httk_flow.cli.main import cli
from httk_flow.ops import demo


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("FLOW_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def flow(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(cli, list(args), catch_exceptions=False)


def campaigns(path: Path) -> list[str]:
    return sorted(os.listdir(path / demo.CAMPAIGN_PLACEMENT))


# -- flow demo ----------------------------------------------------------------------------

REFUSED = (
    "flow: error: ./flow-demo already holds the demo campaign; "
    "remove it or give another directory\n"
)


def test_demo_on_a_directory_holding_the_demo_refuses_and_adds_nothing(
    runner: CliRunner, tmp_path: Path
) -> None:
    demo.build("./flow-demo")
    before = campaigns(tmp_path / "flow-demo")
    r = flow(runner, "demo", "./flow-demo")
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", REFUSED)
    assert campaigns(tmp_path / "flow-demo") == before and len(before) == 1


def test_demo_twice_runs_once_then_refuses_and_show_campaign_stays_unambiguous(
    runner: CliRunner, tmp_path: Path
) -> None:
    first = flow(runner, "demo", "./flow-demo")
    ws = str(tmp_path / "flow-demo")
    assert first.exit_code == 0, first.output
    tail = first.stdout.splitlines()[-5:]
    assert tail[0] == f"workspace: {ws}"
    assert tail[1] == "33 of 33 jobs succeeded, 0 failed"
    assert re.fullmatch(
        rf"fan-out results \(20 children, joined\): {ws}/demo/campaign/campaign--[0-9a-f]{{32}}"
        r"/results\.csv",
        tail[2],
    )
    assert tail[4] == f"explore: flow -w {ws} status | list | show campaign | history campaign"
    again = flow(runner, "demo", "./flow-demo")
    assert (again.exit_code, again.stdout, again.stderr) == (2, "", REFUSED)
    shown = flow(runner, "-w", ws, "show", "campaign")
    assert shown.exit_code == 0, shown.output


def test_demo_into_a_workspace_without_the_demo_is_not_refused(
    runner: CliRunner, tmp_path: Path
) -> None:
    assert flow(runner, "init", "ws").exit_code == 0
    demo.check("ws")  # an existing workspace without the demo may receive it
    (tmp_path / "ws" / "demo" / "campaign").mkdir(parents=True)
    demo.check("ws")  # an empty placement directory holds no campaign


# -- flow init inside another workspace ---------------------------------------------------


def test_init_inside_a_workspace_warns_naming_it_and_creates(
    runner: CliRunner, tmp_path: Path
) -> None:
    assert flow(runner, "init", "outer").exit_code == 0
    inner = tmp_path / "outer" / "runs" / "inner"
    r = flow(runner, "init", "outer/runs/inner")
    assert (r.exit_code, r.stdout) == (0, f"workspace {inner} (non-durable, lease 30s)\n")
    assert r.stderr == (
        f"flow: warning: {inner} is inside workspace {tmp_path / 'outer'}; "
        "commands run below it now find the new workspace, not that one\n"
    )
    assert (inner / ".flow" / "format.json").is_file()


def test_init_inside_a_workspace_with_json_keeps_stdout_a_document(
    runner: CliRunner, tmp_path: Path
) -> None:
    assert flow(runner, "init", "outer").exit_code == 0
    r = flow(runner, "init", "--json", "outer/inner")
    assert r.exit_code == 0
    assert orjson.loads(r.stdout)["workspace"] == str(tmp_path / "outer" / "inner")
    assert r.stderr.startswith(f"flow: warning: {tmp_path / 'outer' / 'inner'} is inside ")


def test_init_again_on_a_nested_workspace_with_exist_ok_does_not_warn(
    runner: CliRunner, tmp_path: Path
) -> None:
    assert flow(runner, "init", "outer").exit_code == 0
    assert flow(runner, "init", "outer/inner").exit_code == 0
    r = flow(runner, "init", "--exist-ok", "outer/inner")
    inner = tmp_path / "outer" / "inner"
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        f"workspace {inner} (non-durable, lease 30s)\n",
        "",
    )


@pytest.mark.parametrize("where", [".flow", ".flow/state/x"])
def test_init_inside_a_workspaces_flow_directory_is_refused(
    runner: CliRunner, tmp_path: Path, where: str
) -> None:
    assert flow(runner, "init", "outer").exit_code == 0
    target = tmp_path / "outer" / where
    r = flow(runner, "init", f"outer/{where}")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (
        f"flow: error: {target}: is inside the .flow directory of workspace "
        f"{tmp_path / 'outer'}; create the workspace somewhere else\n"
    )
    assert not (target / ".flow").exists()


def test_init_outside_any_workspace_prints_no_warning(runner: CliRunner, tmp_path: Path) -> None:
    r = flow(runner, "init", "alone")
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        f"workspace {tmp_path / 'alone'} (non-durable, lease 30s)\n",
        "",
    )
