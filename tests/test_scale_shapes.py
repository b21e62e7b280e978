"""Allocations shaped to the work: queued jobs are grouped by service class (pool,
capabilities, resource request), each group is asked for an allocation that fits it
within the per-node limits, a job larger than those limits is said with its numbers and
not paid for, and the Slurm and local backends turn a profile into what they submit.
A fake backend stands for the batch system; the workspace is real."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from manager.support import make_workspace, submit, write_script

from httk_flow.cli.main import cli
from httk_flow.protocol.resources import Request
from httk_flow.protocol.services import ServiceClass
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import (
    AllocationRecord,
    AllocationStore,
    AllocPhase,
    Reconciler,
    ScaleSettings,
)
from httk_flow.scale.backends.base import (
    AllocationProfile,
    AllocationRequest,
    NodeLimits,
    Observation,
    Outcome,
    Phase,
    SubmitResult,
)
from httk_flow.scale.backends.local import serve_resources
from httk_flow.scale.backends.slurm.script import batch_script, sbatch_argv, shape_args
from httk_flow.scale.shapes import Group, Offer, fit, plan

G = 1 << 30
M = 1 << 20


class FakeBatch:
    """Accepts every submission (handles j1, j2, ...); knows nothing of its nodes unless
    given `limits`."""

    name = "fake"
    signal_margin = 0.0

    def __init__(self, limits: NodeLimits | None = None) -> None:
        self.requests: list[AllocationRequest] = []
        self.cancelled: list[str] = []
        self.limits = limits

    def submit(self, request: AllocationRequest) -> SubmitResult:
        self.requests.append(request)
        return SubmitResult(Outcome.CREATED, f"j{len(self.requests)}")

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        return {h: Observation(Phase.PENDING) for h in handles}

    def find_by_token(self, workspace: str, token: str) -> str | None:
        return None

    def cancel(self, handle: str) -> None:
        self.cancelled.append(handle)

    def diagnostics(self) -> dict[str, str]:
        return {}

    def allocation_end(self) -> float | None:
        return None

    def allocation_id(self) -> str | None:
        return None

    def node_limits(self) -> NodeLimits | None:
        return self.limits


@pytest.fixture
def root(tmp_path: Path) -> str:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def program(tmp_path: Path) -> str:
    return write_script(tmp_path / "scripts", "ok.sh", "exit 0\n")


def tick(root: str, batch: FakeBatch, **settings: object) -> object:
    ws = Workspace.open(root)
    try:
        return Reconciler(ws, batch, ScaleSettings(**settings)).tick()  # type: ignore[arg-type]
    finally:
        ws.close()


def records(root: str) -> list[AllocationRecord]:
    ws = Workspace.open(root)
    try:
        return AllocationStore(ws).load_all()
    finally:
        ws.close()


# -- the fit of one request --------------------------------------------------------------


def test_as_many_jobs_go_on_a_node_as_each_resource_they_ask_for_allows() -> None:
    limits = NodeLimits(cpus=16, gpus=4, mem=64 * G)
    # CPUs alone: 16 one-CPU jobs; memory is not asked for, so none is stated
    assert fit(Request(), 100, limits, Offer()) == AllocationProfile(1, 16, 0, 0)
    # fewer queued jobs than fit: only what they need
    assert fit(Request(cpus=2, mem=G), 3, limits, Offer()) == AllocationProfile(1, 6, 0, 3 * G)
    # memory is the tighter limit: 64G / 24G = 2 jobs of 4 CPUs
    assert fit(Request(cpus=4, mem=24 * G), 10, limits, Offer()) == AllocationProfile(
        1, 8, 0, 48 * G
    )
    # GPUs: 4 per node, one per job
    assert fit(Request(cpus=2, gpus=1), 10, limits, Offer()) == AllocationProfile(1, 8, 4, 0)


def test_a_resource_without_a_limit_allows_one_job_per_node() -> None:
    assert fit(Request(cpus=8), 50, NodeLimits(), Offer()) == AllocationProfile(1, 8, 0, 0)
    # CPUs limited, memory not: one job's memory, so one job
    got = fit(Request(cpus=2, mem=4 * G), 50, NodeLimits(cpus=16), Offer())
    assert got == AllocationProfile(1, 2, 0, 4 * G)


def test_jobs_beyond_one_node_spread_over_up_to_the_most_nodes() -> None:
    limits = NodeLimits(cpus=16, nodes=4)
    assert fit(Request(), 100, limits, Offer()) == AllocationProfile(4, 16, 0, 0)
    assert fit(Request(), 20, limits, Offer()) == AllocationProfile(2, 16, 0, 0)
    assert fit(Request(cpus=4), 3, limits, Offer()) == AllocationProfile(1, 12, 0, 0)


def test_a_request_larger_than_a_node_is_said_with_the_numbers() -> None:
    limits = NodeLimits(
        cpus=8, gpus=2, mem=32 * G, sources=(("cpus", "--cpus-per-node 8"), ("mem", "x"))
    )
    assert fit(Request(cpus=12), 1, limits, Offer()) == (
        "needs 12 CPUs; a node has at most 8 CPUs (--cpus-per-node 8)"
    )
    assert fit(Request(gpus=4), 1, limits, Offer()) == (
        "needs 4 GPUs; a node has at most 2 GPUs (the backend)"
    )
    assert fit(Request(mem=48 * G), 1, limits, Offer()) == (
        "needs 48G memory; a node has at most 32G (x)"
    )
    assert fit(Request(custom=(("licence", 1),)), 1, limits, Offer()) == (
        "needs licence=1; the managers it starts offer licence=0 "
        "(pass --serve-arg=--resource=licence=N)"
    )
    # offered by the serve arguments: 3 licences, one per job, three jobs a node
    offer = Offer.from_serve_args(["--resource", "licence=3", "--pool=a"])
    assert offer == Offer(("a",), (), (("licence", 3),))
    assert fit(Request(custom=(("licence", 1),)), 9, limits, offer) == AllocationProfile(1, 3)


# -- grouping the queue ------------------------------------------------------------------


def test_the_queue_is_grouped_by_class_and_each_group_gets_its_own_shape(
    root: str, program: str
) -> None:
    submit(root, program, 3)
    submit(root, program, 2, resources=Request(cpus=2, mem=G))
    submit(root, program, 1, resources=Request(cpus=16))  # larger than any node
    submit(root, program, 1, pool="gpu")  # a pool its managers do not serve
    batch = FakeBatch()
    r = tick(root, batch, max=4, cpus_per_node=4, mem_per_node=8 * G, time=600.0)
    profiles = sorted((q.profile for q in batch.requests), key=str)
    assert profiles == [AllocationProfile(1, 3, 0, 0), AllocationProfile(1, 4, 0, 2 * G)]
    assert all(q.time == 600.0 for q in batch.requests)
    assert (r.desired, r.unfit) == (2, 2)  # type: ignore[attr-defined]
    assert r.unfit_reason == (  # type: ignore[attr-defined]
        "1 job of pool `gpu`: the managers it starts do not serve pool `gpu`; pass "
        "--serve-arg=--pool=gpu | 1 job of pool `default` with 16 CPUs: needs 16 CPUs; a node "
        "has at most 4 CPUs (--cpus-per-node 4)"
    )
    # each record says what it was asked for, and the same pass again submits nothing
    assert sorted(x.shape for x in records(root)) == ["1×3 CPUs", "1×4 CPUs, 2G"]
    r = tick(root, batch, max=4, cpus_per_node=4, mem_per_node=8 * G, time=600.0)
    assert r.submitted == [] and len(batch.requests) == 2  # type: ignore[attr-defined]


def test_the_larger_group_is_served_first_and_every_group_before_any_gets_a_second(
    root: str, program: str
) -> None:
    submit(root, program, 5)
    submit(root, program, 3, resources=Request(cpus=2))
    batch = FakeBatch()
    tick(root, batch, max=3, jobs_per_manager=2)
    assert [q.profile for q in batch.requests] == [
        AllocationProfile(1, 1),  # 5 queued: 3 wanted, the first round gives one
        AllocationProfile(1, 2),  # 3 queued: 2 wanted
        AllocationProfile(1, 1),
    ]


def test_max_nodes_spreads_a_share_larger_than_a_node_over_several(
    root: str, program: str, tmp_path: Path
) -> None:
    submit(root, program, 300)
    batch = FakeBatch()  # knows nothing of its nodes: the user's limits decide
    tick(root, batch, max=4, cpus_per_node=32, max_nodes=4)
    # 300 jobs, 100 per allocation: 3 allocations of 100 jobs, 32 a node, 4 nodes
    assert [q.profile for q in batch.requests] == [AllocationProfile(4, 32)] * 3
    other = make_workspace(tmp_path / "other")
    submit(other, program, 50)
    batch = FakeBatch(NodeLimits(cpus=8, nodes=1, sources=(("cpus", "this host has 8"),)))
    tick(other, batch, max=4, max_nodes=4)  # a backend of one node: one node
    assert [q.profile for q in batch.requests] == [AllocationProfile(1, 8)]


def test_a_workspace_of_one_class_with_no_limits_asks_one_job_per_allocation(
    root: str, program: str
) -> None:
    submit(root, program, 250)
    batch = FakeBatch()
    tick(root, batch, max=4)
    assert [q.profile for q in batch.requests] == [AllocationProfile(1, 1)] * 3


def test_a_job_too_large_for_the_node_limits_is_reported_and_not_submitted_for(
    root: str, program: str
) -> None:
    submit(root, program, 2, resources=Request(cpus=4, mem=64 * G))
    out = CliRunner().invoke(
        cli,
        [
            *("-w", root, "scale", "--backend", "local", "--once"),
            *("--cpus-per-node", "8", "--mem-per-node", "32G"),
        ],
    )
    assert out.exit_code == 0, out.output
    assert out.stdout == (
        "desired 0, active 0, unfit 2: needs 64G memory; a node has at most 32G "
        "(--mem-per-node 32G)\n"
    )
    assert records(root) == []


def test_the_local_backend_knows_this_hosts_cpus(root: str, program: str) -> None:
    from httk_flow.scale.backends.local import BACKEND as LOCAL

    limits = LOCAL.node_limits()
    assert limits.cpus is not None and limits.cpus >= 1 and limits.nodes == 1
    submit(root, program, 1, resources=Request(cpus=limits.cpus + 1))
    batch = FakeBatch(limits)
    r = tick(root, batch)
    assert r.unfit == 1 and batch.requests == []  # type: ignore[attr-defined]
    assert r.unfit_reason == (  # type: ignore[attr-defined]
        f"needs {limits.cpus + 1} CPUs; a node has at most {limits.cpus} CPUs "
        f"(this host has {limits.cpus})"
    )


# -- which allocations a pass keeps ------------------------------------------------------


def rec(token: str, service: str | None, phase: AllocPhase, created: float) -> AllocationRecord:
    return AllocationRecord(token, "fake", phase, created, created, service=service)


def group(service: str, queued: int, want: int, need: Request | None = None) -> Group:
    sc = ServiceClass(None, (), need or Request())
    return Group(service, sc, queued, want=want, profile=AllocationProfile())


def test_surplus_is_per_class_unstarted_first_never_busy_and_never_below_min() -> None:
    active = [
        rec("old", "a", AllocPhase.RUNNING, 1.0),
        rec("new", "a", AllocPhase.RUNNING, 2.0),
        rec("queued", "a", AllocPhase.PENDING, 0.5),
        rec("b1", "b", AllocPhase.RUNNING, 3.0),
    ]
    groups = [group("a", 10, 1), group("b", 10, 1)]
    fallback = group("", 0, 0)
    steps = plan(active, groups, room=0, minimum=0, busy=set(), fallback=fallback)
    assert [r.token for r in steps.surplus] == ["queued", "new"]
    steps = plan(active, groups, room=0, minimum=0, busy={"new"}, fallback=fallback)
    assert [r.token for r in steps.surplus] == ["queued", "old"]
    steps = plan(active, groups, room=0, minimum=3, busy=set(), fallback=fallback)
    assert [r.token for r in steps.surplus] == ["queued"]
    # nothing queued and --min 2: two of the default shape
    steps = plan([], [], room=4, minimum=2, busy=set(), fallback=fallback)
    assert steps.submit == [fallback, fallback]


def test_an_allocation_of_an_older_release_counts_for_a_class_of_default_requests() -> None:
    legacy = [rec("l1", None, AllocPhase.RUNNING, 1.0), rec("l2", None, AllocPhase.RUNNING, 2.0)]
    groups = [group("big", 5, 1, Request(cpus=2)), group("", 5, 1)]
    steps = plan(legacy, groups, room=4, minimum=0, busy=set(), fallback=group("", 0, 0))
    # l1 serves the default-request group; l2 has nothing to serve; `big` gets its own
    assert [r.token for r in steps.surplus] == ["l2"]
    assert [g.service for g in steps.submit] == ["big"]


# -- what the Slurm backend submits --------------------------------------------------------


def request(**kw: object) -> AllocationRequest:
    fields: dict[str, object] = {
        "workspace": "/ws",
        "token": "a1",
        "log_dir": "/ws/logs",
        "time": 600.0,
        "drain": 120.0,
    }
    fields.update(kw)
    return AllocationRequest(**fields)  # type: ignore[arg-type]


HEAD = [
    "sbatch",
    "--parsable",
    "--job-name=flow-a1",
    "--comment=token=a1",
    "--signal=B:TERM@120",
    "--output=/ws/logs/flow-a1-%j.out",
    "--chdir=/ws",
    "--time=10",
]


def test_a_profile_maps_to_nodes_tasks_cpus_memory_and_gpus() -> None:
    one = request(profile=AllocationProfile(1, 2, 0, G))
    assert sbatch_argv(one) == [
        *HEAD,
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--mem=1024M",
    ]
    gpus = request(profile=AllocationProfile(1, 8, 2, 64 * G))
    assert sbatch_argv(gpus) == [
        *HEAD,
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--mem=65536M",
        "--gres=gpu:2",
    ]
    many = request(profile=AllocationProfile(4, 16), extra_args=("--partition=long",))
    assert sbatch_argv(many) == [
        *HEAD,
        "--nodes=4",
        "--ntasks-per-node=1",
        "--cpus-per-task=16",
        "--partition=long",
    ]
    # no profile (flow sbatch): nothing of a shape, as before
    assert sbatch_argv(request()) == HEAD


def test_the_users_sbatch_args_win_over_the_profile_where_they_set_the_same_thing() -> None:
    profile = AllocationProfile(2, 8, 1, 16 * G)
    mine = ("--mem-per-cpu=4G", "-c", "4", "--gres=gpu:a100:1", "--qos=high", "-N1")
    assert sbatch_argv(request(profile=profile, extra_args=mine)) == [
        *HEAD,
        "--ntasks-per-node=1",
        *mine,
    ]
    assert shape_args(profile, ("--gpus-per-node=2", "--account=x")) == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--mem=16384M",
    ]
    assert shape_args(profile, ("--ntasks=4",)) == [
        "--nodes=2",
        "--cpus-per-task=8",
        "--mem=16384M",
        "--gres=gpu:1",
    ]


def test_the_batch_script_serves_what_was_granted_and_runs_one_manager_per_node() -> None:
    one = batch_script(request(profile=AllocationProfile(1, 2, 0, G)), python="/py")
    serve = (
        'serve=(/py -m httk_flow serve -w /ws --cpus "${SLURM_CPUS_ON_NODE:-2}" '
        '--mem "${SLURM_MEM_PER_NODE:-1024}" --drain-before 120s --signal-margin 60s)'
    )
    assert serve in one.splitlines()
    assert 'if [ "${SLURM_JOB_NUM_NODES:-1}" -le 1 ]; then' in one
    assert '    exec "${serve[@]}"' in one
    many = batch_script(request(profile=AllocationProfile(3, 8, 2)), python="/py")
    assert "exec" not in many  # several nodes: never the batch shell itself
    assert '--cpus "${SLURM_CPUS_ON_NODE:-8}" --gpus "${SLURM_GPUS_ON_NODE:-2}"' in many
    lines = many.splitlines()
    srun = 'srun --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mem=0 \\'
    i = lines.index(srun)
    assert lines[i + 1 : i + 3] == [
        '    --overlap --kill-on-bad-exit=0 "${serve[@]}" &',
        "managers=$!",
    ]
    assert 'scancel --signal=TERM "$SLURM_JOB_ID.0"' in many
    assert "trap drain TERM" in lines
    assert lines[-1] == 'exit "$status"'
    # a memory option of the user's own: the manager finds what it was granted
    own = batch_script(
        request(profile=AllocationProfile(1, 2, 0, G), extra_args=("--mem-per-cpu=1G",))
    )
    assert "--mem " not in own and '--cpus "${SLURM_CPUS_ON_NODE:-2}"' in own


def test_the_local_backend_gives_its_manager_the_profile() -> None:
    assert serve_resources(AllocationProfile(1, 2, 0, G)) == ["--cpus", "2", "--mem", "1024M"]
    assert serve_resources(AllocationProfile(1, 4, 1)) == ["--cpus", "4", "--gpus", "1"]
    assert serve_resources(None) == []


# -- records and `flow allocations` --------------------------------------------------------


def test_allocations_show_their_profile_and_records_of_an_older_release_still_read(
    root: str, program: str
) -> None:
    submit(root, program, 1, resources=Request(cpus=2, mem=G))
    tick(root, FakeBatch(), max=1, cpus_per_node=2, time=300.0)
    [new] = records(root)
    assert new.profile == AllocationProfile(1, 2, 0, G)
    ws = Workspace.open(root)
    old = Path(ws.flow) / "allocations" / "aold.json"
    ws.close()
    # a record as the release before shapes wrote it: no service, no profile
    old.write_bytes(
        orjson.dumps(
            {
                "token": "aold",
                "backend": "slurm",
                "phase": "running",
                "created": 1.0,
                "updated": 1.0,
                "handle": "77",
                "reason": "",
                "ran": True,
                "time": 600.0,
                "attempts": 3,
            }
        )
    )
    by = {x.token: x for x in records(root)}
    assert (by["aold"].service, by["aold"].profile, by["aold"].shape) == (None, None, "-")
    out = CliRunner().invoke(cli, ["-w", root, "allocations"]).stdout.splitlines()
    assert out[0].split() == [
        "TOKEN",
        "BACKEND",
        "PHASE",
        "HANDLE",
        "SHAPE",
        "TIME",
        "SINCE",
        "REASON",
    ]
    rows = {line.split()[0]: line for line in out[1:]}
    assert rows[new.token].split()[2:8] == ["pending", "j1", "1×2", "CPUs,", "1G", "5m"]
    assert rows["aold"].split()[:6] == ["aold", "slurm", "running", "77", "-", "10m"]
    doc = orjson.loads(CliRunner().invoke(cli, ["-w", root, "allocations", "--json"]).stdout)
    got = {a["token"]: a for a in doc["allocations"]}
    assert got[new.token]["profile"] == {"nodes": 1, "cpus": 2, "gpus": 0, "mem": G}
    assert got[new.token]["shape"] == "1×2 CPUs, 1G"
    assert (got["aold"]["profile"], got["aold"]["shape"], got["aold"]["service"]) == (
        None,
        None,
        None,
    )
