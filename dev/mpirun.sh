#!/usr/bin/env bash
# mpirun.sh — mpirun with the options a container or a root shell needs: OpenMPI refuses to run as
# root without --allow-run-as-root, and a machine with fewer cores than ranks needs --oversubscribe.
#   dev/mpirun.sh -np 2 ./train_dbrx --model dbrx-tiny
# Each launch gets an Open MPI session directory of its own (unless the caller set one): concurrent mpiruns share
# /tmp/ompi.<host>.<uid> otherwise, and one's clean-up at its exit can remove it while another is creating its own
# directory there; that launch then fails in orte_init ("Returned value Error (-1) instead of ORTE_SUCCESS": session
# 52's CI, three launches in two runs of the suite, which starts mpiruns three sections at a time). The directories
# left empty by finished launches (more than a minute old) are removed here, at the next launch.
set -euo pipefail
command -v mpirun >/dev/null || { echo "error: mpirun not found: apt-get install openmpi-bin" >&2; exit 1; }
extra=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
if [ -z "${OMPI_MCA_orte_top_session_dir:-}" ]; then
    base=${TMPDIR:-/tmp}
    find "$base" -maxdepth 1 -name 'ompi-launch.*' -type d -empty -mmin +1 -exec rmdir {} + 2>/dev/null || true
    OMPI_MCA_orte_top_session_dir=$(mktemp -d "$base/ompi-launch.XXXXXX") \
        || { echo "error: dev/mpirun.sh: cannot create a session directory in $base" >&2; exit 1; }
    export OMPI_MCA_orte_top_session_dir
fi
exec mpirun "${extra[@]}" "$@"
