"""`flow submit`: one job, an array, or a JSONL file of jobs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.cli.submit_bulk import SHOW_IDS, submit_bulk
from httk_flow.errors import UsageError
from httk_flow.ops import depend
from httk_flow.protocol.after import AfterPolicy
from httk_flow.protocol.bundles import DEFAULT_BUNDLE_MAX
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.groups import default_group
from httk_flow.protocol.inputs import DEFAULT_INPUT_MAX, parse_size
from httk_flow.protocol.jobspec import DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRIES
from httk_flow.protocol.names import DEFAULT_PRIORITY
from httk_flow.protocol.resources import Request
from httk_flow.protocol.submit import SubmitRequest, Submitter

#: options of ours that are not worth a warning when they follow PROGRAM
_NO_WARNING = frozenset({"--help"})


class SubmitCommand(click.Command):
    """Warns about one of `flow submit`'s own options written after PROGRAM.

    Such an argument still goes to the program. The warning is left out when a `--`
    ends `flow submit`'s options before PROGRAM (click swallows that `--`, so the raw
    arguments are scanned here), and for the arguments after a `--` that follows
    PROGRAM (that `--` reaches the program, like every argument after it).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        dashdash = self._dashdash_before_program(ctx, args)
        rest = super().parse_args(ctx, args)
        if not dashdash and not ctx.resilient_parsing and ctx.params.get("program"):
            app = ctx.ensure_object(App)
            for name in self._own_options_in(ctx, ctx.params.get("args") or ()):
                app.warn(
                    f"{name} after the program goes to the program; "
                    "put it before, or use -- to silence this"
                )
        return rest

    def _takes_value(self, ctx: click.Context) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                for name in (*p.opts, *p.secondary_opts):
                    out[name] = not p.is_flag and not p.count
        return out

    def _dashdash_before_program(self, ctx: click.Context, args: list[str]) -> bool:
        """Whether a `--` ends the options before PROGRAM, walking them as click does."""
        takes = self._takes_value(ctx)
        i = 0
        while i < len(args):
            tok = args[i]
            if tok == "--":
                return True
            if tok[:1] != "-" or tok == "-":
                return False  # PROGRAM
            if tok.startswith("--"):
                if "=" not in tok and takes.get(tok, False):
                    i += 1  # the option's value, whatever it looks like
            else:
                for j in range(1, len(tok)):
                    if takes.get("-" + tok[j], False):
                        if j == len(tok) - 1:
                            i += 1
                        break
            i += 1
        return False

    def _own_options_in(self, ctx: click.Context, args: tuple[str, ...]) -> list[str]:
        """Our long option names among ARGS up to a `--`, each once, in order."""
        names = {n for n in self._takes_value(ctx) if n.startswith("--")} - _NO_WARNING
        found: list[str] = []
        for tok in args:
            if tok == "--":
                break
            name = tok.split("=", 1)[0]
            if name in names and name not in found:
                found.append(name)
        return found


@click.command(
    "submit",
    cls=SubmitCommand,
    # parsing stops at PROGRAM: what follows is the program's, while an unknown
    # option before it is click's "No such option" (with a suggestion)
    context_settings={"allow_interspersed_args": False},
)
@click.argument("program", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--name", default="", help="A human-readable name.")
@click.option("--tag", default=None, help="A tag; it becomes part of the job key.")
@click.option("--step", default="main", show_default=True, help="Initial step.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A parameter.")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    # existence, type and size are checked with the job, so the message names the input
    type=click.Path(),
    help="A regular file or directory copied into the job's files/ (repeatable).",
)
@click.option(
    "--input-max",
    "input_max",
    default=None,
    metavar="SIZE",
    help="Most the inputs of one job may total, e.g. 500M, 8G (default 1G).",
)
@click.option(
    "--bundle",
    default=None,
    metavar="DIR",
    help="Store DIR (the program lies inside it) and run the program inside the copy, so "
    "the files beside it are found; FLOW_BUNDLE_DIR names the copy.",
)
@click.option(
    "--bundle-max",
    "bundle_max",
    default=None,
    metavar="SIZE",
    help="Most a --bundle may hold (default 1G); data belongs in --input or shared storage.",
)
@click.option(
    "--in-place",
    "in_place",
    is_flag=True,
    help="Run the program where it is, not a stored copy; an attempt whose program changed "
    "since submission fails (program_changed) instead of running it.",
)
@click.option(
    "--priority",
    type=int,
    default=DEFAULT_PRIORITY,
    show_default=True,
    help="0-999, higher first.",
)
@click.option("--placement", default=None, help="Relative directory for the job.")
@click.option("--pool", default=None, help="Only managers serving this pool run it.")
@click.option("--requires", multiple=True, metavar="CAP", help="A needed capability.")
@click.option(
    "--cpus",
    type=int,
    default=None,
    metavar="N",
    help="CPUs each attempt holds (default 1); it is told them in FLOW_CPUS/FLOW_CPU_LIST.",
)
@click.option(
    "--gpus",
    type=int,
    default=None,
    metavar="N",
    help="GPUs each attempt holds (default 0); CUDA_VISIBLE_DEVICES names its own.",
)
@click.option(
    "--mem",
    default=None,
    metavar="SIZE",
    help="Memory each attempt holds, e.g. 4G or 512M (a bare number is megabytes).",
)
@click.option(
    "--resource",
    "resources",
    multiple=True,
    metavar="NAME=N",
    help="Units of a site-defined resource each attempt holds, e.g. licence=1 (repeatable).",
)
@click.option(
    "--time",
    "time_",
    default=None,
    metavar="DURATION",
    help="Expected runtime (90s, 15m, 2h): what a manager fits into the time it has left.",
)
@click.option(
    "--time-limit",
    "time_limit",
    default=None,
    metavar="DURATION",
    help="Stop an attempt that runs this long (TERM, KILL after the kill grace): a "
    "failure, code time_limit, retried within --retries.",
)
@click.option(
    "--time-limit-factor",
    "time_limit_factor",
    type=float,
    default=1,
    show_default=True,
    metavar="F",
    help="Multiply the limit (and --time) by F after each attempt of the step stopped at it.",
)
@click.option(
    "--retries",
    type=int,
    default=DEFAULT_RETRIES,
    show_default=True,
    help="Extra attempts per activation after a process failure.",
)
@click.option(
    "--max-attempts",
    "max_attempts",
    type=int,
    default=DEFAULT_MAX_ATTEMPTS,
    show_default=True,
    metavar="N",
    help="Failed attempts over the job's life before it fails (drains, takeovers and "
    "advances do not count; flow resume starts it again).",
)
@click.option(
    "--workdir",
    type=click.Choice(["persistent", "isolated"]),
    default="persistent",
    show_default=True,
    help="persistent: one run/ directory kept across attempts (checkpoints); isolated: a "
    "fresh work/ directory per attempt.",
)
@click.option(
    "--require-outcome",
    is_flag=True,
    help="Exit 0 without a published outcome is a protocol error.",
)
@click.option(
    "--array",
    "array",
    default=None,
    metavar="INDICES",
    help="One job per index (1-9, 1-9:2, 1,3,5, 1-3,7,10-20:5); the index is FLOW_ARRAY_INDEX.",
)
@click.option(
    "--from",
    "from_file",
    default=None,
    metavar="FILE.jsonl",
    help="One job per JSON line ('-' = stdin).",
)
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="SELECTOR",
    help="Start only after these jobs end: a job, tag:TAG or group:NAME (repeatable).",
)
@click.option(
    "--after-policy",
    default="ok",
    show_default=True,
    type=click.Choice([p.value for p in AfterPolicy]),
    help="When a dependency does not succeed: ok cancels this job, fail fails it, wait "
    "keeps it waiting (a failed one may be resumed), any runs it anyway.",
)
@click.option(
    "--batch-id",
    "batch_id",
    default=None,
    metavar="KEY",
    help="Name the --from/--array batch (default: b- and a digest of the input and "
    "options); running the same command again completes it, and submits nothing twice.",
)
@click.option(
    "--group",
    default=None,
    metavar="NAME",
    help="The group the jobs join (default: a new group per submission: "
    "sub-YYYYmmdd-HHMMSS-xxxx, or a batch's id); select them with --group NAME.",
)
@click.option(
    "--hold", is_flag=True, help="Register the jobs paused: nothing runs until `flow release`."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def submit(
    app: App,
    /,
    program: str | None,
    args: tuple[str, ...],
    params: tuple[str, ...],
    inputs: tuple[str, ...],
    requires: tuple[str, ...],
    cpus: int | None,
    gpus: int | None,
    mem: str | None,
    resources: tuple[str, ...],
    time_: str | None,
    time_limit: str | None,
    array: str | None,
    from_file: str | None,
    input_max: str | None,
    after: tuple[str, ...],
    after_policy: str,
    bundle_max: str | None,
    batch_id: str | None,
    group: str | None,
    as_json: bool,
    **opts: Any,
) -> None:
    """Submit PROGRAM [ARGS]... as one job (or many with --array / --from)."""
    if program is None and from_file is None:
        raise UsageError("give a PROGRAM to run, or --from FILE.jsonl", obj="flow submit")
    if array and from_file:
        raise UsageError("--array and --from cannot be combined", obj="flow submit")
    if batch_id is not None and array is None and from_file is None:
        raise UsageError(
            "names a batch of --from or --array; a single job is always submitted",
            obj=f"--batch-id {batch_id}",
        )
    base = SubmitRequest(
        program=program or "",
        args=list(args),
        params=_params(params),
        inputs=list(inputs),
        input_max=parse_size(input_max) if input_max is not None else DEFAULT_INPUT_MAX,
        bundle_max=parse_size(bundle_max, "--bundle-max") if bundle_max else DEFAULT_BUNDLE_MAX,
        requires=list(requires),
        resources=Request.build(cpus=cpus, gpus=gpus, mem=mem, custom=list(resources)),
        time=parse_duration(time_, "--time") if time_ else None,
        time_limit=parse_duration(time_limit, "--time-limit") if time_limit else None,
        group=group,
        **opts,
    )
    ws = app.ws
    policy = AfterPolicy(after_policy)
    if group is not None:
        for text in after:
            if text.strip() in (group, f"group:{group}"):
                raise UsageError(
                    "names the group these jobs join: a job cannot wait for itself",
                    obj=f"--after {text.strip()!r}",
                    hint="give the new jobs another --group",
                )
    submitter = Submitter(ws)
    if array is not None or from_file is not None:
        # the batch's digest covers the selectors; its sets are named after the batch, so
        # a re-run that completes it waits for the same sets (protocol.md §14)
        if after:
            base = dataclasses.replace(base, after=depend.placeholders(after, policy))
        return submit_bulk(
            app,
            submitter,
            base,
            from_file=from_file,
            array=array,
            batch_id=batch_id,
            as_json=as_json,
            group=group,
        )
    base = dataclasses.replace(base, group=group or default_group())
    if after:
        deps = depend.prepare(ws, after, policy, actor="submit")
        base = dataclasses.replace(base, after=deps.after)
    jobs = _run(app, submitter, iter([base]), 1)
    if as_json:
        app.json({"jobs": jobs, "group": base.group})
    elif len(jobs) > SHOW_IDS and app.is_terminal:
        app.echo(
            f"submitted {len(jobs)} jobs to {ws.root} as group {base.group}; see them with "
            f"`flow status --group {base.group}`"
        )
    else:
        app.echo("\n".join(j["id"] for j in jobs))
        if app.is_terminal:
            # ids alone when captured (`id=$(flow submit ...)`); a person is told the group
            app.echo(f"group {base.group}")


def _params(items: tuple[str, ...]) -> dict[str, str | int | float | bool]:
    out: dict[str, str | int | float | bool] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError("must be KEY=VALUE", obj=f"--param {item!r}")
        out[key] = value
    return out


def _run(
    app: App, submitter: Submitter, reqs: Iterator[SubmitRequest], total: int | None
) -> list[dict[str, str]]:
    jobs: list[dict[str, str]] = []
    if total is not None and total > 1000 and app.is_terminal:
        from rich.progress import Progress

        with Progress(console=app.console(stderr=True), transient=True) as bar:
            task = bar.add_task("submitting", total=total)
            for spec in submitter.submit(reqs, progress=lambda n: bar.advance(task, n)):
                jobs.append({"id": spec.id, "key": spec.key, "placement": spec.placement})
        return jobs
    for spec in submitter.submit(reqs):
        jobs.append({"id": spec.id, "key": spec.key, "placement": spec.placement})
    return jobs
