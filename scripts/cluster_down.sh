#!/usr/bin/env bash
# `make cluster-down`: stop everything scripts/cluster_up.sh started in $SCALELAB_CLUSTER_DIR
# (default <repo>/.cluster), jobs first. Keeps the folder (the stores survive a restart);
# `--purge` removes it too. Idempotent: a part that is not running is skipped.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$(realpath -m "${SCALELAB_CLUSTER_DIR:-$REPO/.cluster}")"
say() { echo "cluster-down: $*" >&2; }
[[ $(id -u) == 0 ]] || { echo "cluster-down: run as root: sudo make cluster-down" >&2; exit 2; }
[[ -d $DIR ]] || { say "nothing to stop ($DIR does not exist)"; exit 0; }
export SLURM_CONF="$DIR/slurm/slurm.conf"

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }
stop_pid() {  # stop_pid PIDFILE NAME [GRACE_S] [--group]: SIGTERM, then SIGKILL after GRACE_S
    local pidfile=$1 name=$2 grace=${3:-30} target
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    target="$(cat "$pidfile" 2>/dev/null)" || return 0
    [[ ${4:-} == --group ]] && target="-$target"   # the MLflow server's worker processes too
    kill -TERM -- "$target" 2>/dev/null
    for ((i = 0; i < grace * 5; i++)); do alive "$pidfile" || break; sleep 0.2; done
    alive "$pidfile" && kill -KILL -- "$target" 2>/dev/null
    rm -f "$pidfile"
    say "$name stopped"
}

if alive "$DIR/slurm/slurmctld.pid"; then
    scancel --full --quiet --partition=debug 2>/dev/null    # jobs still queued or running
fi
# the server keeps no state of its own (PostgreSQL does): a short grace for open connections
stop_pid "$DIR/mlflow/server.pid" "MLflow server" 5 --group
stop_pid "$DIR/slurm/slurmd.pid" slurmd
stop_pid "$DIR/slurm/slurmctld.pid" slurmctld
stop_pid "$DIR/slurm/slurmdbd.pid" slurmdbd
stop_pid "$DIR/mysql/mariadbd.pid" MariaDB
if [[ -f $DIR/pg/data/postmaster.pid ]]; then
    PGBIN="$(dirname "$(ls -d /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -1)")"
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null 2>&1 \
        && say "PostgreSQL stopped"
fi
stop_pid "$DIR/munge/munged.pid" munged
if [[ ${1:-} == --purge ]]; then
    rm -rf "$DIR" && say "removed $DIR"
fi
exit 0
