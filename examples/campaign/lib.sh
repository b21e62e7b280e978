# Shared by the campaign's stages; sourced from beside them, which works under the engine
# because they are submitted with --bundle (the directory is stored and run as a whole).
# shellcheck shell=bash

results_dir() {
    local d="$FLOW_WORKSPACE_DIR/results"
    mkdir -p "$d"
    printf '%s\n' "$d"
}

# the toy model: structure i has its energy minimum at a = 5 + i/10
equilibrium() {
    awk -v i="$1" 'BEGIN { printf "%.6f\n", 5 + i / 10 }'
}
