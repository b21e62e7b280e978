"""`flow serve` / `flow run` pass their flags as written; manager.config resolves them."""

from __future__ import annotations

import dataclasses
import os

import pytest
from click.testing import CliRunner

from httk_flow.cli.main import cli
from httk_flow.errors import UsageError
from httk_flow.manager.config import ALLOCATION_END_ENV, ManagerConfig
from httk_flow.protocol.resources import Grant


def test_flags_as_written_become_the_managers_configuration() -> None:
    cfg = ManagerConfig.resolve(
        exit_when_idle="2m",
        workers=3,
        pools=("gpu",),
        caps=("big",),
        lease="45s",
        placements=("runs/a",),
        log_format="json",
        quiet=True,
        drain_timeout="5s",
        kill_grace="1s",
        environ={},
    )
    # the inventory is the machine's: compared on its own in tests/test_resources.py
    assert cfg.inventory is not None and cfg.inventory.cpus >= 1
    assert dataclasses.replace(cfg, inventory=None) == ManagerConfig(
        workers=3,
        pools=("gpu",),
        capabilities=("big",),
        placements=("runs/a",),
        lease=45.0,
        exit_when_idle=120.0,
        log_format="json",
        verbose=False,
        drain_timeout=5.0,
        kill_grace=1.0,
    )
    # the default follows the CPUs this process may run on, not the machine's count
    usable = len(os.sched_getaffinity(0))
    assert ManagerConfig.resolve(exit_when_idle=None, environ={}).workers == usable
    granted = ManagerConfig.resolve(
        exit_when_idle=None, environ={}, grant=lambda _env: Grant(cpus=1)
    )
    assert granted.workers == 1


def test_the_work_ends_by_the_earliest_end_anyone_names() -> None:
    def at(walltime: str | None, alloc: float | None, env: str | None) -> float | None:
        return ManagerConfig.resolve(
            exit_when_idle=None,
            walltime=walltime,
            allocation_end=lambda: alloc,
            environ={ALLOCATION_END_ENV: env} if env else {},
            now=1000.0,
        ).ends_at

    assert at(None, None, None) is None
    assert at("1m", None, None) == 1060.0
    assert at("1m", 1030.0, None) == 1030.0
    assert at("1m", 1030.0, "1010") == 1010.0
    assert at(None, None, "2000.5") == 2000.5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"environ": {ALLOCATION_END_ENV: "soon"}}, "$FLOW_ALLOCATION_END: is not a unix time"),
        ({"pools": ("bad pool",)}, "pool"),
        ({"lease": "0.1s"}, "lease"),
        ({"walltime": "later"}, "--walltime"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(flags: dict[str, object], message: str) -> None:
    flags.setdefault("environ", {})
    with pytest.raises(UsageError) as e:
        ManagerConfig.resolve(exit_when_idle=None, **flags)  # type: ignore[arg-type]
    assert message in e.value.render()


def test_serve_says_which_flag_is_bad_with_exit_2(
    runner: CliRunner, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOCATION_END_ENV, "soon")
    r = runner.invoke(cli, ["run", "-w", ws])
    assert r.exit_code == 2
    assert r.stderr == "flow: error: $FLOW_ALLOCATION_END: is not a unix time\n"
    monkeypatch.delenv(ALLOCATION_END_ENV)
    r = runner.invoke(cli, ["serve", "-w", ws, "--exit-when-idle", "soon"])
    assert r.exit_code == 2 and "--exit-when-idle" in r.stderr
