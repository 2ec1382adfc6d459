#!/usr/bin/env bash
# mpirun.sh — mpirun with the options a container or a root shell needs: OpenMPI refuses to run as
# root without --allow-run-as-root, and a machine with fewer cores than ranks needs --oversubscribe.
#   dev/mpirun.sh -np 2 ./train_dbrx --model dbrx-tiny
set -euo pipefail
command -v mpirun >/dev/null || { echo "error: mpirun not found: apt-get install openmpi-bin" >&2; exit 1; }
extra=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
exec mpirun "${extra[@]}" "$@"
