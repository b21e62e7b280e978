#!/usr/bin/env bash
# An equation-of-state scan of silicon with Quantum ESPRESSO's pw.x (Debian's
# quantum-espresso): the parent job spawns one child per lattice constant; each child
# writes its input (step prepare) and runs one SCF (step scf); once every child
# succeeded the parent collects the total energies into one CSV (step aggregate).
#
#   flow submit --step scan --param n=8 --param a_min=10.0 --param a_max=10.5 \
#       --input tests/field/si.scf.in.template tests/field/eos.sh
#
# Parameters of the parent: n (number of points, at least 2), a_min and a_max (the
# lattice constant celldm(1) in bohr, both ends included), template (the input with
# @ALAT@ and @PSEUDO_DIR@, default the parent's input files/si.scf.in.template), pseudo_dir
# (default /usr/share/espresso/pseudo, from quantum-espresso-data), pwx (default pw.x).
# The children get alat, template, pseudo_dir and pwx. Every result is a file in the
# job's directory: energy.line (pw.x's "!    total energy" line as printed) and
# result.csv (alat,energy_ry), and the parent's eos.csv (alat,energy_ry, one row per
# child in spawn order).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../shell/flow.sh
source "$FLOW_BASH_API"

# pw.x is serial here: one OpenMP thread, no mpirun (a singleton MPI process)
export OMP_NUM_THREADS=1

flow_steps scan prepare scf aggregate

step_scan() {
    local n a_min a_max template pseudo_dir pwx i alat
    flow_param -v n n 8
    flow_param -v a_min a_min 10.0
    flow_param -v a_max a_max 10.5
    flow_param -v template template "$FLOW_JOB_DIR/files/si.scf.in.template"
    flow_param -v pseudo_dir pseudo_dir /usr/share/espresso/pseudo
    flow_param -v pwx pwx pw.x
    if ((n < 2)); then
        flow_fail "n must be at least 2 (got $n)" bad_param
        return
    fi
    for ((i = 0; i < n; i++)); do
        alat=$(awk -v i="$i" -v n="$n" -v lo="$a_min" -v hi="$a_max" \
            'BEGIN { printf "%.4f", lo + (hi - lo) * i / (n - 1) }')
        flow_spawn --label "a$alat" --tag "a${alat//./p}" --step prepare --param alat="$alat" \
            --param template="$template" --param pseudo_dir="$pseudo_dir" --param pwx="$pwx"
    done
    flow_wait aggregate --all-succeeded
}

step_prepare() {
    local alat template pseudo_dir
    flow_param -v alat alat
    flow_param -v template template
    flow_param -v pseudo_dir pseudo_dir
    sed -e "s|@ALAT@|$alat|g" -e "s|@PSEUDO_DIR@|$pseudo_dir|g" "$template" >"$FLOW_WORKDIR/scf.in.tmp"
    mv -f "$FLOW_WORKDIR/scf.in.tmp" "$FLOW_WORKDIR/scf.in"
    flow_advance scf "input written for alat=$alat"
}

step_scf() {
    local alat pwx line energy status=0
    flow_param -v alat alat
    flow_param -v pwx pwx
    cd "$FLOW_WORKDIR"
    # an interrupted try may have left its scratch and a partial output: start clean
    rm -rf tmp scf.out
    "$pwx" -in scf.in >scf.out 2>scf.err || status=$?
    if ((status != 0)); then
        flow_retry "pw.x exited with status $status (alat=$alat)"
        return
    fi
    if ! grep -q 'convergence has been achieved' scf.out; then
        flow_fail "pw.x did not converge (alat=$alat)" not_converged
        return
    fi
    line=$(grep '^!' scf.out || true)
    if [[ $line != *$'\n'* && $line =~ ^!\ +total\ energy\ +=\ +(-?[0-9]+\.[0-9]+)\ Ry$ ]]; then
        energy=${BASH_REMATCH[1]}
    else
        flow_fail "no single total energy line in scf.out (alat=$alat)" no_energy
        return
    fi
    rm -rf tmp
    printf '%s\n' "$line" >"$FLOW_JOB_DIR/energy.line.tmp"
    printf '%s,%s\n' "$alat" "$energy" >"$FLOW_JOB_DIR/result.csv.tmp"
    mv -f "$FLOW_JOB_DIR/energy.line.tmp" "$FLOW_JOB_DIR/energy.line"
    mv -f "$FLOW_JOB_DIR/result.csv.tmp" "$FLOW_JOB_DIR/result.csv"
    flow_succeed "alat=$alat E=$energy Ry"
}

step_aggregate() {
    local label id state path row out=$FLOW_JOB_DIR/eos.csv count=0
    printf 'alat,energy_ry\n' >"$out.tmp"
    while read -r label id state path; do
        if [[ $state != succeeded ]]; then
            flow_fail "child $label ($id) ended $state" child_failed
            return
        fi
        read -r row <"$path/result.csv"
        printf '%s\n' "$row" >>"$out.tmp"
        count=$((count + 1))
    done < <(flow_children)
    mv -f "$out.tmp" "$out"
    flow_succeed "$count energies in eos.csv"
}

flow_main "$@"
