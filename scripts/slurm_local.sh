#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for kiln's `--executor slurm` and its tests.
#
#   bash scripts/slurm_local.sh up      # install (Debian packages) if missing, then start
#   bash scripts/slurm_local.sh down    # stop everything `up` started
#   bash scripts/slurm_local.sh env     # print `export SLURM_CONF=...` for a shell to eval
#   bash scripts/slurm_local.sh status
#
# What runs: munged, MariaDB (the accounting database), slurmdbd (so sacct works, which pydra's
# Slurm worker polls), slurmctld and slurmd on localhost, with one partition `cpu` holding every
# core, and a partition `down` that runs nothing (jobs sent there wait: for tests of deadlines). All state, logs and sockets live in $KILN_SLURM_DIR (default /tmp/kiln-slurm-$UID); the
# daemons listen on 127.0.0.1 only, on ports from $KILN_SLURM_PORT (default 16817) up.
#
# Note: this needs root (apt-get, and slurmd running jobs as their user). `up` is idempotent: a
# cluster already up is left as it is. Jobs finished are kept in the accounting database until
# `down`, which removes the whole folder.
#
# GPU nodes (documented here, not started here): add to slurm.conf `GresTypes=gpu` and
# `Gres=gpu:h200:2` on the NodeName line, and a gres.conf with `Name=gpu Type=h200
# File=/dev/nvidia[0-1]`; kiln's jobs then ask for `--gres=gpu:1` through `[executor.slurm] gres`.
set -euo pipefail

DIR=${KILN_SLURM_DIR:-/tmp/kiln-slurm-$(id -u)}
PORT=${KILN_SLURM_PORT:-16817}
CONF=$DIR/etc/slurm.conf
export SLURM_CONF=$CONF

say() { echo "slurm_local: $*" >&2; }
die() { say "$*"; exit 1; }

install_packages() {
    local missing=()
    for cmd in slurmctld:slurm-wlm slurmdbd:slurmdbd munged:munge mariadbd:mariadb-server; do
        command -v "${cmd%%:*}" >/dev/null 2>&1 || missing+=("${cmd#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "needs ${missing[*]} (Debian packages) and root to install them; run as root"
    command -v apt-get >/dev/null || die "needs ${missing[*]}; this machine has no apt-get: install them yourself"
    say "installing ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >"$DIR/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$DIR/apt.log" 2>&1 \
            || die "apt-get install ${missing[*]} failed; see $DIR/apt.log"
    fi
}

write_configs() {
    local cores mem user
    cores=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    user=$(id -un)
    mkdir -p "$DIR"/{etc,state,spool,log,run,db}
    cat >"$CONF" <<EOF
ClusterName=kiln
SlurmctldHost=localhost
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT + 2))
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=300
NodeName=localhost CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=down Nodes=localhost MaxTime=INFINITE State=DOWN
EOF
    cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$((PORT + 2))
SlurmUser=$user
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 3))
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/etc/slurmdbd.conf"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local limit=$1 what=$2
    shift 2
    for _ in $(seq $((limit * 5))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "$what did not come up in ${limit} s; see $DIR/log"
}

# Note: munge's socket stays where Slurm looks for it (/run/munge): some of Slurm's connections
# (slurmctld to slurmdbd) ignore AuthInfo. So one munged serves every cluster on this machine
# (a munged already answering there is used as it is), and the clusters using it are listed in
# $MUNGE_USERS: the last one down stops the munged a cluster of kiln's started (two test workers
# with a cluster each once lost their auth when the first one's `down` took munged with it).
MUNGE_USERS=/run/munge/kiln-clusters
MUNGE_PID=/run/munge/kiln-munged.pid

start_munge() {
    mkdir -p "$MUNGE_USERS"
    exec 9>/run/munge/kiln.lock
    flock 9
    echo "$DIR" > "$MUNGE_USERS/$(cluster_id)"
    if ! munge -n >/dev/null 2>&1; then
        [ -f /etc/munge/munge.key ] || die "no /etc/munge/munge.key: reinstall the munge package"
        munged --force --pid-file="$MUNGE_PID" --log-file=/run/munge/kiln-munged.log \
            --seed-file=/run/munge/kiln-munge.seed 2>>/run/munge/kiln-munged.log
        wait_for 10 munged munge -n
    fi
    flock -u 9
}

stop_munge() {  # this cluster stops using munged; the last one using it stops it
    [ -d "$MUNGE_USERS" ] || return 0
    exec 9>/run/munge/kiln.lock
    flock 9
    rm -f "$MUNGE_USERS/$(cluster_id)"
    for user in "$MUNGE_USERS"/*; do  # a cluster whose folder is gone (no `down` ran) uses nothing
        [ -f "$user" ] && [ ! -d "$(cat "$user")" ] && rm -f "$user"
    done
    if [ -z "$(ls -A "$MUNGE_USERS")" ] && [ -f "$MUNGE_PID" ]; then
        stop_pid_file "$MUNGE_PID"
    fi
    flock -u 9
}

cluster_id() {
    echo "$DIR" | md5sum | cut -c1-16
}

start_database() {
    if [ ! -d "$DIR/db/mysql" ]; then
        mariadb-install-db --user="$(id -un)" --datadir="$DIR/db" --auth-root-authentication-method=normal \
            >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $DIR/log"
    fi
    mariadbd --user="$(id -un)" --datadir="$DIR/db" --socket="$DIR/run/mysql.sock" \
        --pid-file="$DIR/run/mariadb.pid" --bind-address=127.0.0.1 --port=$((PORT + 3)) \
        --log-error="$DIR/log/mariadb.log" --innodb-buffer-pool-size=32M >/dev/null 2>&1 &
    wait_for 30 MariaDB mariadb --socket="$DIR/run/mysql.sock" -u root -e "select 1"
    mariadb --socket="$DIR/run/mysql.sock" -u root -e \
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

up() {
    mkdir -p "$DIR"
    chmod 755 "$DIR"  # munge's socket inside must be reachable by every user
    if running slurmd && running slurmctld && timeout 10 scontrol ping >/dev/null 2>&1; then
        say "up already ($DIR)"
        return 0
    fi
    down_quietly
    install_packages
    write_configs
    start_munge
    start_database
    slurmdbd 2>>"$DIR/log/slurmdbd.log"  # reads slurmdbd.conf beside $SLURM_CONF
    wait_for 30 slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/$((PORT + 2))"
    slurmctld -f "$CONF" 2>>"$DIR/log/slurmctld.log"
    wait_for 30 slurmctld scontrol ping
    sacctmgr -i add cluster kiln >/dev/null 2>&1 || true  # slurmctld adds it too; either is fine
    slurmd -f "$CONF" 2>>"$DIR/log/slurmd.log"
    wait_for 30 "the node" bash -c "sinfo -h -o %T | grep -qx idle"
    wait_for 30 accounting sacct -n -X -S now
    say "up: partition cpu, $(nproc) cores ($DIR); eval \"\$(bash $0 env)\" to use it"
}

running() {  # running NAME: whether the daemon in NAME's pid file is alive
    [ -f "$DIR/run/$1.pid" ] && kill -0 "$(cat "$DIR/run/$1.pid")" 2>/dev/null
}

stop_pid() {  # stop_pid NAME: TERM, then KILL after 10 s
    stop_pid_file "$DIR/run/$1.pid"
}

stop_pid_file() {  # stop_pid_file FILE: the process it names
    local file=$1 pid
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

down_quietly() {
    for name in slurmd slurmctld slurmdbd mariadb; do stop_pid "$name"; done
    stop_munge
}

down() {
    down_quietly
    rm -rf "$DIR"
    say "down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    status) sinfo && squeue ;;
    *) die "usage: $0 up|down|env|status" ;;
esac
