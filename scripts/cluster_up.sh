#!/usr/bin/env bash
# `make cluster-up`: a single-node SLURM (munge, MariaDB for accounting, slurmdbd, slurmctld,
# slurmd) and an MLflow tracking server on PostgreSQL, all on 127.0.0.1, all state in one folder:
# $SCALELAB_CLUSTER_DIR (default <repo>/.cluster). Idempotent: a part already running is left
# alone. Ends by printing the lines to paste (MLFLOW_TRACKING_URI, SLURM_CONF, and the Optuna
# storage: SCALELAB_OPTUNA_STORAGE, PGPASSFILE).
# Runs as root (SLURM's daemons do); installs the Debian packages if they are missing.
# docs/cluster.md says what each part is for; scripts/cluster_down.sh stops them all.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$(realpath -m "${SCALELAB_CLUSTER_DIR:-$REPO/.cluster}")"
PY="${SCALELAB_PYTHON:-$REPO/.venv/bin/python}"
say() { echo "cluster-up: $*" >&2; }
die() { echo "cluster-up: $*" >&2; exit 2; }

[[ $(id -u) == 0 ]] || die "run as root (slurmctld and slurmd run as root here): sudo make cluster-up"
[[ -x $PY ]] || die "$PY is missing: run make install first (or set SCALELAB_PYTHON)"
"$PY" -c "import psycopg" 2>/dev/null \
    || die "the PostgreSQL driver psycopg is missing: $PY -m pip install 'psycopg[binary]'"

# --- packages ---------------------------------------------------------------------------------
need=()
for pair in munged:munge slurmctld:slurm-wlm slurmdbd:slurmdbd mariadbd:mariadb-server; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if ((${#need[@]})); then
    say "installing ${need[*]} (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"; } \
        >"${TMPDIR:-/tmp}/scalelab-cluster-apt.log" 2>&1 \
        || die "apt-get install ${need[*]} failed; see ${TMPDIR:-/tmp}/scalelab-cluster-apt.log"
fi
PGBIN="$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")"

# PostgreSQL runs as the postgres user, which must reach its folder
id postgres >/dev/null 2>&1 || die "no postgres user: apt-get install postgresql"
mkdir -p "$DIR"
runuser -u postgres -- test -x "$DIR" \
    || die "the postgres user cannot enter $DIR (a parent folder is private): set SCALELAB_CLUSTER_DIR to a folder under one it can traverse"
mkdir -p "$DIR"/{munge,mysql,slurm/state,slurm/spool,slurm/log,pg,mlflow/artifacts}
chmod 755 "$DIR" "$DIR/pg"

# --- ports: chosen once (free at that time), kept in ports.env ---------------------------------
if [[ ! -f $DIR/ports.env ]]; then
    "$PY" - >"$DIR/ports.env" <<'EOF'
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(("127.0.0.1", 0))
names = ["SLURMCTLD", "SLURMD", "SLURMDBD", "MARIADB", "POSTGRES", "MLFLOW", "SRUN"]
for name, s in zip(names, socks):
    print(f"{name}_PORT={s.getsockname()[1]}")
EOF
fi
# shellcheck disable=SC1091
source "$DIR/ports.env"

# a daemon killed but not yet reaped by its parent (a zombie, state Z) is not alive: restart it
alive() {
    local pid; pid="$(cat "$1" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}
wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local t=$1 what=$2; shift 2
    for ((i = 0; i < t * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    die "$what did not come up in $t s; see the logs under $DIR"
}

# --- munge (SLURM's authentication) ------------------------------------------------------------
if ! alive "$DIR/munge/munged.pid"; then
    [[ -f $DIR/munge/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" status=none; }
    chmod 700 "$DIR/munge"; chmod 400 "$DIR/munge/munge.key"
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    say "munged started"
fi

# --- MariaDB: slurmdbd's store, so that sacct (and submitit, which asks it) knows every job ----
if ! alive "$DIR/mysql/mariadbd.pid"; then
    if [[ ! -d $DIR/mysql/data/mysql ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$DIR/mysql/install.log" 2>&1 \
            || die "mariadb-install-db failed; see $DIR/mysql/install.log"
    fi
    nohup mariadbd --no-defaults --user=root --datadir="$DIR/mysql/data" \
        --socket="$DIR/mysql/mysql.sock" --port="$MARIADB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$DIR/mysql/mariadbd.pid" --log-error="$DIR/mysql/error.log" \
        --innodb-buffer-pool-size=64M --skip-log-bin >/dev/null 2>&1 &
    wait_for 60 MariaDB mariadb --no-defaults --socket="$DIR/mysql/mysql.sock" -u root -e "SELECT 1"
    mariadb --no-defaults --socket="$DIR/mysql/mysql.sock" -u root -e \
        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    say "MariaDB started on 127.0.0.1:$MARIADB_PORT"
fi

# --- SLURM configuration: one node (this machine), one partition ------------------------------
NODE="$(hostname -s)"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
cat >"$DIR/slurm/slurm.conf" <<EOF
ClusterName=scalelab
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
SrunPortRange=$SRUN_PORT-$((SRUN_PORT + 20))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/slurm/state
SlurmdSpoolDir=$DIR/slurm/spool/%n
SlurmctldPidFile=$DIR/slurm/slurmctld.pid
SlurmdPidFile=$DIR/slurm/slurmd.pid
SlurmctldLogFile=$DIR/slurm/log/slurmctld.log
SlurmdLogFile=$DIR/slurm/log/slurmd.log
# no cgroups in a container: track job processes by parent pid, bind no cpus
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# jobs share the node by CPU, so several sweep points run at once
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$SLURMDBD_PORT
# the munge socket for slurmdbd connections (AuthInfo covers the others)
AccountingStoragePass=$DIR/munge/munge.socket
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerParameters=sched_interval=2
MessageTimeout=30
KillWait=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$DIR/slurm/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$SLURMDBD_PORT
SlurmUser=root
PidFile=$DIR/slurm/slurmdbd.pid
LogFile=$DIR/slurm/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MARIADB_PORT
StorageUser=slurm
StorageLoc=slurm_acct_db
EOF
chmod 600 "$DIR/slurm/slurmdbd.conf"
export SLURM_CONF="$DIR/slurm/slurm.conf"

if ! alive "$DIR/slurm/slurmdbd.pid"; then
    slurmdbd || die "slurmdbd did not start; see $DIR/slurm/log/slurmdbd.log"
    wait_for 60 slurmdbd sacctmgr -n list cluster
    say "slurmdbd started"
fi
if ! alive "$DIR/slurm/slurmctld.pid"; then
    slurmctld -i || die "slurmctld did not start; see $DIR/slurm/log/slurmctld.log"
    wait_for 60 slurmctld scontrol ping
    say "slurmctld started"
fi
if ! alive "$DIR/slurm/slurmd.pid"; then
    slurmd -N "$NODE" || die "slurmd did not start; see $DIR/slurm/log/slurmd.log"
fi
node_idle() { [[ $(sinfo -h -n "$NODE" -o %t) == idle* || $(sinfo -h -n "$NODE" -o %t) == mix* || $(sinfo -h -n "$NODE" -o %t) == alloc* ]]; }
if ! node_idle; then
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
fi
wait_for 60 "the SLURM node $NODE (sinfo)" node_idle
say "SLURM up: node $NODE, $(nproc) CPUs, partition debug"

# --- PostgreSQL: MLflow's backend store (root cannot run postgres: the postgres user does) ------
PGDATA="$DIR/pg/data"
as_pg() { runuser -u postgres -- "$@"; }
if [[ ! -f $PGDATA/PG_VERSION ]]; then
    head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DIR/pg/password"
    chmod 600 "$DIR/pg/password"
    install -d -o postgres -m 700 "$PGDATA"
    printf '%s\n' "$(cat "$DIR/pg/password")" >"$DIR/pg/pwfile.tmp"
    chown postgres "$DIR/pg/pwfile.tmp"
    as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        --pwfile="$DIR/pg/pwfile.tmp" >"$DIR/pg/initdb.log" 2>&1 \
        || { rm -f "$DIR/pg/pwfile.tmp"; die "initdb failed; see $DIR/pg/initdb.log"; }
    rm -f "$DIR/pg/pwfile.tmp"
fi
chown postgres "$DIR/pg"
if ! as_pg "$PGBIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$DIR/pg/postgres.log" -w -t 60 start \
        -o "-p $POSTGRES_PORT -k $DIR/pg -c listen_addresses=127.0.0.1 -c max_connections=200" \
        >/dev/null || die "PostgreSQL did not start; see $DIR/pg/postgres.log"
    say "PostgreSQL started on 127.0.0.1:$POSTGRES_PORT"
fi
PGPASS="$(cat "$DIR/pg/password")"
psql_pg() { as_pg "$PGBIN/psql" -h "$DIR/pg" -p "$POSTGRES_PORT" -U postgres -v ON_ERROR_STOP=1 -qtAc "$1"; }
[[ $(psql_pg "SELECT 1 FROM pg_roles WHERE rolname='mlflow'") == 1 ]] \
    || psql_pg "CREATE ROLE mlflow LOGIN PASSWORD '$PGPASS'"
[[ $(psql_pg "SELECT 1 FROM pg_database WHERE datname='mlflow'") == 1 ]] \
    || psql_pg "CREATE DATABASE mlflow OWNER mlflow"
# Optuna's study store (hparams_search): a database of its own, since Optuna and MLflow both
# keep an alembic_version table. libpq reads the password from pgpass, so the URL holds none.
[[ $(psql_pg "SELECT 1 FROM pg_database WHERE datname='optuna'") == 1 ]] \
    || psql_pg "CREATE DATABASE optuna OWNER mlflow"
(umask 077; printf '127.0.0.1:%s:optuna:mlflow:%s\n' "$POSTGRES_PORT" "$PGPASS" >"$DIR/pg/pgpass")

# --- the MLflow tracking server ----------------------------------------------------------------
URI="http://127.0.0.1:$MLFLOW_PORT"
health() { "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" "$URI"; }
if ! alive "$DIR/mlflow/server.pid"; then
    # the password stays out of the command line (ps): MLflow reads the store URI from this file
    BACKEND="postgresql+psycopg://mlflow:$PGPASS@127.0.0.1:$POSTGRES_PORT/mlflow"
    (umask 077; printf '%s' "$BACKEND" >"$DIR/mlflow/backend_uri")
    # no job runner: it serves MLflow's GenAI jobs, which scalelab never submits, and costs
    # ~1.4 GB and a quarter of a core while idle (scalelab/tracking/ui.py: SERVER_ENV)
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
    MLFLOW_BACKEND_STORE_URI="$BACKEND" nohup setsid "$PY" -m mlflow server \
        --host 127.0.0.1 --port "$MLFLOW_PORT" --workers "${SCALELAB_MLFLOW_WORKERS:-4}" \
        --artifacts-destination "$DIR/mlflow/artifacts" >"$DIR/mlflow/server.log" 2>&1 &
    echo $! >"$DIR/mlflow/server.pid"
    wait_for 120 "the MLflow server ($URI)" health
    say "MLflow server started on $URI (store: PostgreSQL database mlflow, artifacts: $DIR/mlflow/artifacts)"
fi
health || die "the MLflow server at $URI does not answer; see $DIR/mlflow/server.log"

echo "export MLFLOW_TRACKING_URI=$URI"
echo "export SLURM_CONF=$SLURM_CONF"
echo "export SCALELAB_OPTUNA_STORAGE=postgresql+psycopg://mlflow@127.0.0.1:$POSTGRES_PORT/optuna"
echo "export PGPASSFILE=$DIR/pg/pgpass"
