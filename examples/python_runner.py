#!/usr/bin/env python3
"""The three-step workflow of three_step.sh with the Python runner API.

    flow submit --step prepare --param n=100 examples/python_runner.py && flow run

The interpreter found by the shebang must have httk_flow installed (activate its
environment before starting the manager).
"""

from __future__ import annotations

import os

from httk_flow.runner import Runner

flow = Runner()


@flow.step
def prepare(flow: Runner) -> None:
    n = int(flow.param("n", "10"))
    with open(os.path.join(flow.workdir, "input.txt"), "w") as fh:
        fh.write(f"{n}\n")
    flow.advance("compute", f"input written (n={n})")


@flow.step
def compute(flow: Runner) -> None:
    with open(os.path.join(flow.workdir, "input.txt")) as fh:
        n = int(fh.read())
    total = sum(i * i for i in range(1, n + 1))
    with open(os.path.join(flow.workdir, "sum.txt"), "w") as fh:
        fh.write(f"{total}\n")
    flow.advance("collect", "sum computed")


@flow.step
def collect(flow: Runner) -> None:
    with open(os.path.join(flow.workdir, "input.txt")) as fh:
        n = int(fh.read())
    with open(os.path.join(flow.workdir, "sum.txt")) as fh:
        total = int(fh.read())
    with open(os.path.join(flow.job_dir, "result.csv"), "w") as fh:
        fh.write(f"n,sum_of_squares\n{n},{total}\n")
    flow.succeed(f"sum of squares 1..{n} = {total}")


if __name__ == "__main__":
    raise SystemExit(flow.run())
