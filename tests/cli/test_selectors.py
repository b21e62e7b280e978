"""One set of selectors for every command that acts on jobs: JOB idents, --tag, --group,
--state and --all, combined with AND, through real `flow` processes (and a manager
where jobs must run); and the dependency selectors of `resolve_after`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from manager.support import Managers, flow, make_workspace, write_script

from httk_flow.cli.app import App
from httk_flow.cli.main import cli
from httk_flow.errors import JobNotFound, UsageError
from httk_flow.ops.select import Selection, one, resolve_after, select
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace


def _ok(root: str, *args: str) -> str:
    r = flow("-w", root, *args)
    assert r.returncode == 0, f"flow {' '.join(args)} -> {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout


def _json(root: str, *args: str) -> Any:
    return orjson.loads(_ok(root, args[0], "--json", *args[1:]))


def _err(root: str, *args: str) -> tuple[int, str]:
    r = flow("-w", root, *args)
    assert r.stdout == "", r.stdout
    return r.returncode, r.stderr


@pytest.fixture
def camp(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Group A: two jobs tagged x; group B: one tagged x, one tagged y. Keys by name."""
    root = make_workspace(tmp_path / "ws")
    keys = {}
    for name, group, tag in (
        ("a1", "A", "x"),
        ("a2", "A", "x"),
        ("b1", "B", "x"),
        ("b2", "B", "y"),
    ):
        [job] = _json(root, "submit", "--group", group, "--tag", tag, "--name", name, "true")[
            "jobs"
        ]
        keys[name] = job["key"]
    return root, keys


def _listed(root: str, *args: str) -> list[str]:
    return sorted(j["key"] for j in _json(root, "list", *args)["jobs"])


def test_list_combines_selectors_with_and(camp: tuple[str, dict[str, str]]) -> None:
    root, k = camp
    assert _listed(root, "--tag", "x") == sorted([k["a1"], k["a2"], k["b1"]])
    assert _listed(root, "--tag", "x", "--group", "B") == [k["b1"]]
    assert _listed(root, "--group", "A", "--group", "B", "--tag", "y") == [k["b2"]]
    assert _listed(root, "--group", "B", "--state", "ready") == []
    assert _listed(root, "y") == [k["b2"]]
    out = _ok(root, "list", "--group", "B", "--format", "key,group,tag,state")
    assert sorted(out.splitlines()[1:]) == sorted(
        [f"{k['b1']}  B      x    submitted", f"{k['b2']}  B      y    submitted"]
    )
    assert _listed(root, "--all") == sorted(k.values())


def test_an_unknown_group_is_an_error_not_an_empty_selection(
    camp: tuple[str, dict[str, str]],
) -> None:
    root, _ = camp
    for cmd in ("list", "cancel", "wait", "status", "show"):
        assert _err(root, cmd, "--group", "nope") == (
            2,
            "flow: error: group 'nope': is no group of this workspace; see the groups with "
            "`flow groups`\n",
        ), cmd


def test_show_and_logs_need_exactly_one_job_and_say_how_to_narrow(
    camp: tuple[str, dict[str, str]],
) -> None:
    root, k = camp
    code, err = _err(root, "show", "x")
    assert code == 2 and err == (
        f"flow: error: job 'x': matches 3 jobs ({', '.join(_order(root, k, 'x'))}); select them "
        "all with --tag x, narrow with --state/--group, or give the job's key\n"
    )
    assert _json(root, "show", "x", "--group", "B")["key"] == k["b1"]
    assert _json(root, "show", "--group", "B", "--tag", "y")["key"] == k["b2"]
    code, err = _err(root, "show", "--group", "A")
    assert code == 2 and err.startswith("flow: error: selection --group A: matches 2 jobs (")
    assert err.endswith("); narrow with --state/--tag/--group, or give the job's key\n")
    code, err = _err(root, "logs", "--tag", "x", "--state", "failed")
    assert (code, err) == (
        2,
        "flow: error: selection --tag x --state failed: matches no job; see `flow list`\n",
    )
    assert _err(root, "show") == (
        2,
        "flow: error: JOB: name a JOB (or select one with --tag/--group/--state)\n",
    )
    code, err = _err(root, "show", "A")
    assert code == 2 and err == (
        "flow: error: job 'A': matches no job; it is a group: select its jobs with --group A\n"
    )


def _order(root: str, k: dict[str, str], tag: str) -> list[str]:
    """The keys of a tag in the order a walk finds them (as the error lists them)."""
    return [j["key"] for j in _json(root, "list", "--tag", tag)["jobs"]]


def test_steering_takes_tags_and_groups(camp: tuple[str, dict[str, str]]) -> None:
    root, k = camp
    out = _ok(root, "pause", "--group", "A", "--yes")
    assert sorted(out.splitlines()) == sorted(f"{k[n]}: submitted -> paused" for n in ("a1", "a2"))
    out = _ok(root, "priority", "--tag", "x", "--state", "paused", "--yes", "3")
    assert sorted(out.splitlines()) == sorted(
        f"{k[n]}: paused -> paused (priority 3)" for n in ("a1", "a2")
    )
    out = _ok(root, "resume", "--tag", "x", "--yes")
    assert sorted(out.splitlines()) == sorted(f"{k[n]}: paused -> ready" for n in ("a1", "a2"))
    doc = _json(root, "cancel", "--group", "B", "--tag", "y", "--yes")
    assert doc == {
        "jobs": [{"id": k["b2"][-32:], "key": k["b2"], "from": "submitted", "to": "cancelled"}],
        "errors": [],
    }
    rows = {j["key"]: (j["state"], j["priority"]) for j in _json(root, "list")["jobs"]}
    assert rows == {
        k["a1"]: ("ready", 3),
        k["a2"]: ("ready", 3),
        k["b1"]: ("submitted", 500),
        k["b2"]: ("cancelled", 500),
    }
    assert _err(root, "cancel") == (
        2,
        "flow: error: flow cancel: name at least one JOB (or --tag TAG / --group GROUP / "
        "--state KIND / --all)\n",
    )


def test_a_bulk_selection_by_group_asks_at_a_terminal(
    runner: CliRunner, camp: tuple[str, dict[str, str]]
) -> None:
    root, _ = camp
    app = App()
    app.is_terminal = True  # the prompt is for people at a terminal
    r = runner.invoke(cli, ["-w", root, "cancel", "--group", "A"], input="n\n", obj=app)
    assert r.exit_code == 1 and "cancel 2 job(s)?" in r.output
    assert {j["state"] for j in _json(root, "list", "--group", "A")["jobs"]} == {"submitted"}


def test_status_counts_only_the_selected_jobs(camp: tuple[str, dict[str, str]]) -> None:
    root, _ = camp
    _ok(root, "cancel", "--tag", "y", "--yes")
    doc = _json(root, "status", "--group", "B")
    assert (doc["total"], {s: n for s, n in doc["counts"].items() if n}) == (
        2,
        {"submitted": 1, "cancelled": 1},
    )
    doc = _json(root, "status", "--tag", "x", "--state", "submitted", "--by", "tag")
    assert (doc["total"], doc["groups"]) == (3, {"x": {"submitted": 3}})


def test_wait_and_logs_on_a_tag_and_a_group_with_a_manager(
    tmp_path: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "ws")
    say = write_script(tmp_path / "scripts", "say.sh", 'echo "said $FLOW_PARAM_w"\n')
    _ok(root, "submit", "--group", "G", "--tag", "one", "--param", "w=1", say)
    _ok(root, "submit", "--group", "G", "--tag", "two", "--param", "w=2", say)
    _ok(root, "submit", "--group", "H", "--retries", "0", "false")
    managers.run(root)
    assert _ok(root, "wait", "--group", "G") == "2/2 done: 2 succeeded, 0 failed, 0 cancelled\n"
    assert _ok(root, "wait", "--tag", "two") == "1/1 done: 1 succeeded, 0 failed, 0 cancelled\n"
    r = flow("-w", root, "wait", "--group", "G", "--group", "H")
    assert (r.returncode, r.stdout) == (1, "3/3 done: 2 succeeded, 1 failed, 0 cancelled\n")
    assert _ok(root, "logs", "--group", "G", "--tag", "two") == "said 2\n"
    assert _ok(root, "logs", "one") == "said 1\n"


def test_dependency_selectors_resolve_by_kind_and_bare_words_in_order(
    camp: tuple[str, dict[str, str]],
) -> None:
    root, k = camp
    ws = Workspace.open(root)
    try:

        def keys(text: str) -> list[str]:
            return sorted(h.key for h in resolve_after(ws, text))

        assert keys("group:A") == sorted([k["a1"], k["a2"]])
        assert keys("tag:y") == [k["b2"]]
        assert keys(f"job:{k['b1']}") == [k["b1"]]
        assert keys(k["a1"][-32:]) == [k["a1"]]
        assert keys(k["a1"][-32:][:10]) == [k["a1"]]
        assert keys("B") == sorted([k["b1"], k["b2"]])
        assert keys("x") == sorted([k["a1"], k["a2"], k["b1"]])
        _ok(root, "submit", "--group", "y", "true")  # a group named like a tag
        with pytest.raises(UsageError) as e:
            resolve_after(ws, "y")
        assert e.value.render() == (
            "selector 'y': is both a group and a tag; write group:y or tag:y"
        )
        assert keys("tag:y") == [k["b2"]] and len(keys("group:y")) == 1
        for text in ("nothing", "tag:zz", "group:zz"):
            with pytest.raises(JobNotFound):
                resolve_after(ws, text)
        with pytest.raises(UsageError, match="unknown kind 'grp'"):
            resolve_after(ws, "grp:A")
        sel = Selection(groups=("A",), states=(State.SUBMITTED,))
        assert sorted(h.key for h in select(ws, sel)) == sorted([k["a1"], k["a2"]])
        assert one(ws, Selection(idents=("y",))).key == k["b2"]
    finally:
        ws.close()


def test_a_bulk_selection_that_changes_nothing_says_so_and_is_no_error(
    camp: tuple[str, dict[str, str]],
) -> None:
    root, _ = camp

    def run(*args: str) -> tuple[int, str, str]:
        r = flow("-w", root, *args)
        return r.returncode, r.stdout, r.stderr

    warn = "flow: warning: "
    assert run("cancel", "--tag", "nothing") == (
        0,
        "",
        f"{warn}no job matches --tag nothing: nothing to cancel\n",
    )
    assert run("resume", "--tag", "x", "--group", "A") == (
        0,
        "",
        f"{warn}2 job(s) match --tag x --group A, none in a state to resume (2 submitted)\n",
    )
    assert run("priority", "--tag", "nothing", "7") == (
        0,
        "",
        f"{warn}no job matches --tag nothing: nothing to reprioritise\n",
    )
    assert run("release", "--group", "B", "--tag", "nothing") == (
        0,
        "",
        f"{warn}no job matches --tag nothing --group B: nothing to release\n",
    )
    # --quiet prints nothing but errors; --json keeps stdout a document
    assert run("pause", "--tag", "nothing", "--quiet") == (0, "", "")
    code, out, err = run("cancel", "--tag", "nothing", "--json")
    assert (code, orjson.loads(out), err) == (
        0,
        {"jobs": [], "errors": []},
        f"{warn}no job matches --tag nothing: nothing to cancel\n",
    )
    # a wait on a tag nothing carries (a typo?) ends at once, and says why
    assert run("wait", "--tag", "nothing") == (
        0,
        "0/0 done: 0 succeeded, 0 failed, 0 cancelled\n",
        f"{warn}no job matches --tag nothing: nothing to wait for\n",
    )
    # what does change something prints its lines, and no warning
    code, out, err = run("pause", "--tag", "y", "--yes")
    assert (code, err, len(out.splitlines())) == (0, "", 1)
