"""Resource requests, inventories and the packing of one into the other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httk_flow.errors import UsageError
from httk_flow.manager.inventory import Inventory, detect, parse_gpu_flag
from httk_flow.manager.slots import Slots
from httk_flow.ops.bulk import jsonl_requests
from httk_flow.protocol.resources import Request, format_size, parse_size
from httk_flow.protocol.services import ServiceClass
from httk_flow.protocol.submit import SubmitRequest
from httk_flow.scale.backends import current_grant

FLOW = [sys.executable, "-m", "httk_flow"]
G = 1 << 30


def test_sizes_read_as_batch_systems_write_them() -> None:
    assert parse_size("4G", "--mem") == 4 * G
    assert parse_size("512M", "--mem") == 512 << 20
    assert parse_size("2048", "--mem") == 2 << 30  # a bare number is megabytes
    assert parse_size("1.5GiB", "--mem") == 3 * G // 2
    assert format_size(3 * G // 2) == "1.5G"
    assert format_size(4 * G) == "4G"
    with pytest.raises(UsageError) as e:
        parse_size("4Q", "--mem")
    assert e.value.render() == "--mem: '4Q' is not a size; write e.g. 4G, 512M or 2048 (megabytes)"


def test_a_request_round_trips_and_a_default_one_writes_nothing() -> None:
    r = Request.build(cpus=4, gpus=1, mem="8G", custom=["licence=1", "scratch=0"])
    assert r.to_json() == {"cpus": 4, "gpus": 1, "mem": 8 * G, "custom": {"licence": 1}}
    assert Request.from_json(r.to_json(), "x") == r
    assert Request().to_json() == {}
    assert Request.from_json(None, "x") == Request()
    assert r.describe() == "4 CPUs, 1 GPU, 8G memory, licence=1"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cpus": 0}, "flow submit: --cpus: must be from 1 to 1048576"),
        ({"gpus": -1}, "flow submit: --gpus: must be from 0 to 1048576"),
        ({"custom": ["licence"]}, "flow submit: --resource 'licence': is not NAME=N; "),
        ({"custom": ["gpus=2"]}, "flow submit: --resource 'gpus=2': 'gpus' has its own option"),
        ({"custom": ["a=1", "a=2"]}, "flow submit: resource 'a' is given twice"),
        ({"custom": ["a=x"]}, "flow submit: --resource 'a=x': 'x' is not a whole number"),
    ],
)
def test_bad_requests_are_refused_naming_the_option(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as e:
        Request.build(**kw)  # type: ignore[arg-type]
    assert e.value.render().startswith(message)


@pytest.mark.parametrize(
    "data",
    [
        {"cpus": True},
        {"cpus": 0},
        {"gpus": "1"},
        {"mem": -1},
        {"custom": {"x": 0}},
        {"custom": []},
        {"other": 1},
        [],
    ],
)
def test_a_damaged_stored_request_is_refused(data: object) -> None:
    with pytest.raises(UsageError):
        Request.from_json(data, "job.json")


def test_classes_without_requests_keep_their_ids() -> None:
    """Ids named before requests existed must not change (markers carry them)."""
    assert ServiceClass().id == ""
    old = ServiceClass("gpu", ("cuda",))
    assert old.id == ServiceClass("gpu", ("cuda",), Request()).id
    assert old.id == "3cz9g6s45y0b"  # as the release before requests named it
    big = ServiceClass("gpu", ("cuda",), Request(cpus=4))
    assert big.id not in ("", old.id)
    assert ServiceClass(None, (), Request(cpus=4)).id != ""


def test_jsonl_lines_carry_requests_over_the_command_line() -> None:
    base = SubmitRequest(program="true", resources=Request(cpus=2, mem=G))
    lines = [
        b'{"args": ["a"]}\n',
        b'{"cpus": 4, "gpus": 1}\n',
        b'{"mem": "8G", "resources": {"licence": 1}}\n',
        b'{"mem": 1024}\n',
    ]
    got = [r.resources for r in jsonl_requests(iter(lines), base, "jobs.jsonl")]
    assert got == [
        Request(cpus=2, mem=G),
        Request(cpus=4, gpus=1, mem=G),
        Request(cpus=2, mem=8 * G, custom=(("licence", 1),)),
        Request(cpus=2, mem=G),
    ]
    with pytest.raises(UsageError) as e:
        list(jsonl_requests(iter([b'{"cpus": "4"}\n']), base, "jobs.jsonl"))
    assert e.value.render() == "jobs.jsonl:1: cpus: must be a whole number"


def test_submit_refuses_a_bad_request_in_whole(tmp_path: Path) -> None:
    subprocess.run([*FLOW, "init", str(tmp_path / "ws")], check=True, capture_output=True)
    out = subprocess.run(
        [*FLOW, "submit", "-w", str(tmp_path / "ws"), "--mem", "lots", "true"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr == (
        "flow: error: flow submit: --mem: 'lots' is not a size; write e.g. 4G, 512M or "
        "2048 (megabytes)\n"
    )


def _inv(**env: str) -> Inventory:
    """The inventory in an environment, with what the batch backends read from it."""
    return detect(
        environ=env,
        grant=current_grant(env),
        affinity=lambda: {0, 1, 2, 3, 4, 5, 6, 7},
        read_text=_no_files,
    )


def _no_files(path: str) -> str | None:
    return None


def test_inventory_follows_the_environment_it_runs_in() -> None:
    inv = _inv()
    assert (inv.cpus, inv.cpu_ids, inv.gpus) == (8, tuple(range(8)), ())
    assert dict(inv.sources)["cpus"] == "the affinity mask"
    slurm = _inv(SLURM_CPUS_ON_NODE="4", SLURM_MEM_PER_NODE="2048", SLURM_JOB_GPUS="2,3")
    assert (slurm.cpus, slurm.cpu_ids, slurm.gpus, slurm.mem) == (
        4,
        (0, 1, 2, 3),
        ("2", "3"),
        2 * G,
    )
    assert dict(slurm.sources) == {
        "cpus": "Slurm (SLURM_CPUS_ON_NODE)",
        "gpus": "SLURM_JOB_GPUS",
        "mem": "Slurm (SLURM_MEM_PER_NODE)",
    }
    per_node = _inv(SLURM_JOB_CPUS_PER_NODE="2(x3),1", SLURM_MEM_PER_CPU="100")
    assert (per_node.cpus, per_node.mem) == (2, 200 << 20)
    # the CUDA runtime's own variable wins over the batch system's global ids
    cuda = _inv(CUDA_VISIBLE_DEVICES="0,1", SLURM_JOB_GPUS="6,7")
    assert cuda.gpus == ("0", "1")
    assert _inv(CUDA_VISIBLE_DEVICES="").gpus == ()
    assert _inv(CUDA_VISIBLE_DEVICES="NoDevFiles").gpus == ()


def test_inventory_flags_win_and_gpu_lists_are_ids() -> None:
    inv = detect(
        cpus=2,
        gpus="1",
        mem="3G",
        resources=("licence=2",),
        environ={"CUDA_VISIBLE_DEVICES": "4,5"},
        affinity=lambda: {0, 1, 2, 3},
        read_text=_no_files,
    )
    assert (inv.cpus, inv.cpu_ids, inv.gpus, inv.mem, inv.custom) == (
        2,
        (0, 1),
        ("4",),
        3 * G,
        (("licence", 2),),
    )
    assert parse_gpu_flag("3") == 3
    assert parse_gpu_flag("0,1") == ("0", "1")
    assert parse_gpu_flag("2,") == ("2",)
    with pytest.raises(UsageError):
        parse_gpu_flag("0,0")
    with pytest.raises(UsageError):
        parse_gpu_flag("a b")


def test_the_cgroup_memory_limit_is_found_on_an_ancestor() -> None:
    files = {
        "/proc/self/cgroup": "0::/slurm/job_7/step_0\n",
        "/sys/fs/cgroup/slurm/job_7/step_0/memory.max": "max\n",
        "/sys/fs/cgroup/slurm/job_7/memory.max": str(3 * G) + "\n",
    }
    inv = detect(environ={}, affinity=lambda: {0}, read_text=files.get)
    assert inv.mem == 3 * G
    assert dict(inv.sources)["mem"] == "the cgroup limit"


def test_lacks_says_why_in_numbers() -> None:
    inv = Inventory(cpus=4, cpu_ids=(0, 1, 2, 3), gpus=("0",), mem=8 * G)
    assert inv.lacks(Request(cpus=4, gpus=1, mem=8 * G)) is None
    assert inv.lacks(Request(cpus=8)) == "needs 8 CPUs; this manager has 4"
    assert inv.lacks(Request(gpus=2)) == "needs 2 GPUs; this manager has 1"
    assert inv.lacks(Request(mem=16 * G)) == "needs 16G memory; this manager has 8G"
    assert inv.lacks(Request(custom=(("licence", 1),))) == (
        "needs licence=1; this manager has licence=0"
    )


def test_a_reservation_keeps_back_what_the_waiting_job_needs(tmp_path: Path) -> None:
    inv = Inventory(cpus=4, cpu_ids=(0, 1, 2, 3), gpus=("0", "1"), mem=8 * G)
    slots = Slots(inv, ledger=None)
    held = slots.take(Request(cpus=3))
    assert held is not None
    big = Request(cpus=2)
    assert not slots.fits(big)
    assert slots.fits(Request(cpus=1))
    assert not slots.fits(Request(cpus=1), reserved=big)  # the one free CPU is kept
    assert slots.fits(Request(cpus=1, gpus=0), reserved=Request(cpus=0, gpus=2))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(1, 4),
            st.integers(0, 2),
            st.integers(0, 3),
        ),
        max_size=40,
    )
)
def test_slots_never_give_out_more_than_there_is(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[bool, int, int, int]]
) -> None:
    from httk_flow.manager.devices import DeviceLedger

    ledger = DeviceLedger(str(tmp_path_factory.mktemp("ledger")))
    inv = Inventory(cpus=4, cpu_ids=(0, 1, 2, 3), gpus=("a", "b", "c"), mem=4 * G)
    slots = Slots(inv, bind_cpus=True, ledger=ledger)
    held = []
    for take, cpus, gpus, mem in ops:
        if take or not held:
            b = slots.take(Request(cpus=cpus, gpus=gpus, mem=mem * G))
            if b is not None:
                held.append(b)
        else:
            slots.give(held.pop(0))
        cpu_ids = [c for b in held for c in b.cpu_ids]
        gpu_ids = [g for b in held for g in b.gpus]
        assert len(cpu_ids) == len(set(cpu_ids)) <= 4
        assert len(gpu_ids) == len(set(gpu_ids)) <= 3
        assert sum(b.mem for b in held) <= 4 * G
        assert slots.free_cpus == 4 - len(cpu_ids)
    for b in held:
        slots.give(b)
    assert slots.free_cpus == 4 and slots.free_gpus == 3 and slots.mem_free == 4 * G


def test_a_jsonl_request_error_names_the_line_once_and_its_key() -> None:
    base = SubmitRequest(program="true")
    with pytest.raises(UsageError) as e:
        list(jsonl_requests(iter([b'{"cpus": 0}\n']), base, "jobs.jsonl"))
    assert e.value.render() == "jobs.jsonl:1: cpus: must be from 1 to 1048576"
    with pytest.raises(UsageError) as e:
        Request.build(custom=["memory=4"])
    assert e.value.render() == (
        "flow submit: --resource 'memory=4': 'memory' has its own option; use --mem"
    )
