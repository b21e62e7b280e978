#!/bin/bash
# One httk_flow manager for the length of a Slurm allocation, submitted by hand:
#
#     sbatch examples/sbatch-manager.sh /path/to/workspace [flow serve options...]
#
# `flow sbatch` submits the same thing for you (and `flow scale --backend slurm` keeps
# as many of them running as the queue needs); this script is for sites and users who
# want to write their own #SBATCH lines. Options given to sbatch on its command line
# override the #SBATCH lines below.
#
# At the walltime: Slurm sends SIGTERM to the batch shell 120 s before the time limit
# (--signal=B:TERM@120; B: = the batch shell, which is the manager thanks to `exec`).
# The manager stops claiming, stops its running jobs (they go back to the queue,
# not counted as failures), commits what finished, and exits before Slurm kills it.
#
#SBATCH --job-name=flow-manager
#SBATCH --time=04:00:00
#SBATCH --signal=B:TERM@120
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --output=flow-manager-%j.out

set -euo pipefail

workspace=${1:-${FLOW_WORKSPACE:-}}
if [ -z "$workspace" ]; then
    echo "usage: sbatch $0 WORKSPACE [flow serve options...]" >&2
    exit 2
fi
shift || true

# `flow` from the environment sbatch exported (activate the venv before sbatch), or $FLOW
flow=${FLOW:-flow}

# one worker per CPU Slurm gave us; a --workers among the options given after the
# workspace overrides it (the last one wins)
workers=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}

# --drain-before: the manager claims only jobs whose --time ends before the TERM is
# due (keep it equal to the --signal offset above; Slurm may signal up to a minute
# earlier, which the manager leaves out too)
# exec: the manager replaces this shell, so the TERM from --signal reaches it directly
exec "$flow" serve -w "$workspace" --workers "$workers" --drain-before 120s "$@"
