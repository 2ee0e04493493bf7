#!/usr/bin/env bash
# PostgreSQL with a streaming hot standby behind HAProxy, and a scripted failover, for the
# local stack (docs/operations.md, "PostgreSQL failover (deploy/pg-ha.sh)").
#
#   deploy/pg-ha.sh up        node A: initdb, primary; node B: pg_basebackup -R with a
#                             replication slot, hot standby streaming from A; HAProxy in front
#                             routing to whichever node is primary; database `notify`.
#                             Idempotent; after `down` it resumes with the roles as they were.
#   deploy/pg-ha.sh down      stop HAProxy and both nodes (by pid), keep the data
#   deploy/pg-ha.sh clean     down, then delete the data and the configuration
#   deploy/pg-ha.sh status    each node's role, port and pid; replication state; HAProxy's route
#   deploy/pg-ha.sh env       the settings that send the binaries through HAProxy
#   deploy/pg-ha.sh failover  kill -9 the primary's postmaster, promote the standby, wait until
#                             HAProxy routes to it, rebuild the old primary as its standby
#                             (pg_rewind, else a fresh pg_basebackup); prints
#                             `pg-ha: failover primary=a->b routed_after_s=X standby_back_after_s=Y`
#   deploy/pg-ha.sh sync on|off   synchronous replication on or off on the current primary
#
# Settings (environment, with defaults):
#   NOTIFY_STACK_DIR   folder for config, logs and pids       (<repo>/.stack)
#   NOTIFY_PG_PORT     the local stack's PostgreSQL port      (55432; only for the default below)
#   NOTIFY_PG_HA_PORT  HAProxy's front port                   (NOTIFY_PG_PORT + 10); node A
#                      listens on front + 1, node B on front + 2, all on 127.0.0.1
#   NOTIFY_PG_HA_SYNC  1: synchronous replication from `up`, 0: asynchronous; unset: as
#                      last set by `up` or `sync` (asynchronous at first)
#
# Layout: $STACK/pg-ha/{a,b}/data (or /var/lib/notify-local/<hash>/pg-ha/... when the
# postgres user cannot reach $STACK, like local-stack.sh's pg_dir), $STACK/pg-ha/haproxy.cfg
# and check-primary.sh, logs $STACK/logs/pg-ha-{a,b,haproxy}.log, pids
# $STACK/pids/pg-ha-{a,b,haproxy}.pid, state $STACK/pg-ha/primary and $STACK/pg-ha/sync.
#
# Which node is primary is decided by the data: the node without standby.signal. When both
# lack one (a failover interrupted between the promotion and the rebuild), the running
# primary, else the later timeline, else the state file $STACK/pg-ha/primary (written right
# after each promotion) decides, and `up` rebuilds the other as its standby.
#
# Synchronous mode is non-strict, like Patroni's synchronous_mode: synchronous_standby_names
# names the standby only while it streams. A failover clears it on the promoted node before
# the promotion and sets it again once the rebuilt standby streams. In that window
# (routed_after_s to standby_back_after_s, a few seconds) commits are acknowledged by the new
# primary alone: losing that node then (a second crash with its disk) loses them. Outside a
# failover the script does not degrade by itself: with sync on and the standby down, commits
# wait until it is back or `sync off`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
PG_PORT=${NOTIFY_PG_PORT:-55432}
FRONT=${NOTIFY_PG_HA_PORT:-$((PG_PORT + 10))}
HA=$STACK/pg-ha
NODES=(a b)

log() { printf '[pg-ha] %s\n' "$*" >&2; }
die() { printf '[pg-ha] error: %s\n' "$*" >&2; exit 1; }

case "$FRONT" in '' | *[!0-9]*) die "NOTIFY_PG_HA_PORT=$FRONT: not a port" ;; esac
{ [ "$FRONT" -ge 1 ] && [ "$FRONT" -le 65533 ]; } || die "NOTIFY_PG_HA_PORT=$FRONT: not a port (node B needs front + 2)"
case "${NOTIFY_PG_HA_SYNC:-}" in '' | 0 | 1) ;; *) die "NOTIFY_PG_HA_SYNC=${NOTIFY_PG_HA_SYNC}: use 0 or 1" ;; esac

# --- helpers shared with local-stack.sh (copied: that script runs its verbs when sourced;
# pg_bin and apt_install come from host.sh) ---

# shellcheck source=deploy/host.sh
source "$here/host.sh"

# A live process: not gone, and not a zombie nobody reaped yet (a killed postmaster's
# parent is init, which may take a while).
pid_running() { # pid
  kill -0 "$1" 2>/dev/null || return 1
  local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}
alive() { [ -f "$1" ] && pid_running "$(cat "$1")"; }

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# Stops the process of $STACK/pids/NAME.pid: SIGTERM, SIGKILL after 10 s.
stop_pid() { # name
  local f=$STACK/pids/$1.pid
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if pid_running "$pid"; then
    log "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do pid_running "$pid" || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# --- nodes ---

# Where the nodes' data lives: under $STACK/pg-ha unless the postgres user cannot reach
# $STACK (a checkout under /root, say), as local-stack.sh's pg_dir does.
data_root() {
  if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$STACK"; then
    echo "/var/lib/notify-local/$(printf '%s' "$STACK" | sha1sum | cut -c1-12)/pg-ha"
  else
    echo "$HA"
  fi
}

other() { if [ "$1" = a ]; then echo b; else echo a; fi; }
port_of() { if [ "$1" = a ]; then echo $((FRONT + 1)); else echo $((FRONT + 2)); fi; }
node_of_port() {
  case "$1" in
    "$((FRONT + 1))") echo a ;;
    "$((FRONT + 2))") echo b ;;
    *) echo "?" ;;
  esac
}
data_of() { echo "$(data_root)/$1/data"; }
sock_of() { echo "$(data_root)/$1/sock"; }
pidfile_of() { echo "$STACK/pids/pg-ha-$1.pid"; }
log_of() { echo "$STACK/logs/pg-ha-$1.log"; }
has_data() { [ -f "$(data_of "$1")/PG_VERSION" ]; }
is_standby_data() { [ -f "$(data_of "$1")/standby.signal" ]; }

# The node's postmaster pid, when it runs: from the pid file, else from postmaster.pid when
# that process is a live postgres (the pid file is then written again).
node_pid() { # node
  local f; f=$(pidfile_of "$1")
  if alive "$f"; then cat "$f"; return 0; fi
  local pm; pm=$(data_of "$1")/postmaster.pid
  [ -f "$pm" ] || return 1
  local pid; pid=$(head -n 1 "$pm")
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  if pid_running "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ]; then
    echo "$pid" >"$f"; echo "$pid"; return 0
  fi
  return 1
}

# psql against one node (or the front: q front ...), tuples only; fails when not reachable.
q() { # node|front sql...
  local port
  if [ "$1" = front ]; then port=$FRONT; else port=$(port_of "$1"); fi
  shift
  PGCONNECT_TIMEOUT=3 psql -X -w -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -tAq -c "$*" 2>/dev/null
}

# Pids of every process of a node, the postmaster's children included (even orphaned):
# the processes whose working directory is its data folder.
node_procs() { # node
  local data d p out=''; data=$(data_of "$1")
  for d in /proc/[0-9]*; do
    [ "$(readlink "$d/cwd" 2>/dev/null)" = "$data" ] || continue
    p=${d#/proc/}; out="$out${out:+ }$p"
  done
  echo "$out"
}

# A killed postmaster stays a zombie until init reaps it (here that took seconds), and
# postgres takes the pid in postmaster.pid of a zombie for a live server. Waits for the
# reaping, and removes the lock file of a zombie that no process of the node outlives.
clear_stale_lock() { # node
  local pm pid i; pm=$(data_of "$1")/postmaster.pid
  [ -f "$pm" ] || return 0
  pid=$(head -n 1 "$pm")
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    pid_running "$pid" && return 0
    sleep 0.1
  done
  if [ -z "$(node_procs "$1")" ]; then
    log "node $1: postmaster $pid is a zombie nobody reaps: removing its postmaster.pid"
    rm -f "$pm"
  fi
}

role_of() { # node -> primary | standby | stopped | unreachable
  node_pid "$1" >/dev/null || { echo stopped; return; }
  case "$(q "$1" 'select pg_is_in_recovery()' || true)" in
    f) echo primary ;;
    t) echo standby ;;
    *) echo unreachable ;;
  esac
}

# The running node that answers as primary (fails when none; dies when both do).
live_primary() {
  local n found=()
  for n in "${NODES[@]}"; do [ "$(role_of "$n")" = primary ] && found+=("$n"); done
  [ ${#found[@]} -le 1 ] || die "both nodes answer as primary (split brain): stop one (\`$0 status\`)"
  [ ${#found[@]} -eq 1 ] || return 1
  echo "${found[0]}"
}

# Which node is primary according to the data (see the header).
data_primary() {
  local cands=() n
  for n in "${NODES[@]}"; do has_data "$n" && ! is_standby_data "$n" && cands+=("$n"); done
  case ${#cands[@]} in
    0) if has_data a || has_data b; then die "no node's data is a primary (both have standby.signal)"; fi
       echo a ;;
    1) echo "${cands[0]}" ;;
    *) # Both were primaries: the later timeline (a promotion) wins, else the state file.
       local ta tb st; ta=$(tli_of a) tb=$(tli_of b)
       if [ "$ta" -gt "$tb" ]; then echo a; return; fi
       if [ "$tb" -gt "$ta" ]; then echo b; return; fi
       st=$(cat "$HA/primary" 2>/dev/null || echo a)
       case "$st" in a | b) echo "$st" ;; *) echo a ;; esac ;;
  esac
}

tli_of() { # node: the timeline of its last checkpoint (0 when unknown)
  local t
  t=$(as_pg "$(pg_bin)/pg_controldata" -D "$(data_of "$1")" 2>/dev/null | awk -F: '/^Latest checkpoint.s TimeLineID/ { gsub(/ /, "", $2); print $2 }')
  case "$t" in '' | *[!0-9]*) echo 0 ;; *) echo "$t" ;; esac
}

# Server settings: local-stack.sh's (max_connections, shared_buffers, max_wal_size,
# pg_stat_statements, track_io_timing), plus replication, in pg-ha.conf in each data folder
# (included by postgresql.conf, written again before each start; pg_basebackup and
# pg_rewind copy both). In the data folder rather than on the command line so that
# pg_rewind's single-user crash recovery keeps wal_log_hints (which pg_rewind needs: it
# reads it from pg_control) and a reload does not complain about values the command line
# changed. The slot keeps the WAL a stopped standby needs, up to max_slot_wal_keep_size
# (beyond that the slot is invalidated and `up` copies the standby afresh). wal_keep_size
# keeps the last 1 GB of WAL on every node: a rewound old primary replays from the last
# checkpoint before the timelines diverged, older than its new slot on the promoted node,
# and under load the promoted node's first checkpoints had already recycled that WAL
# ("requested WAL segment ... has already been removed", then a full base backup: the
# rebuild took 140 s instead of a few).
write_node_conf() { # node
  local data; data=$(data_of "$1")
  as_pg tee "$data/pg-ha.conf" >/dev/null <<'EOF'
# Written by deploy/pg-ha.sh before each start: edits are lost.
listen_addresses = '127.0.0.1'
max_connections = 400
shared_buffers = 256MB
max_wal_size = 4GB
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
track_io_timing = on
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
max_slot_wal_keep_size = 4GB
wal_keep_size = 1GB
wal_log_hints = on
hot_standby = on
hot_standby_feedback = on
EOF
  grep -q "^include_if_exists = 'pg-ha.conf'" "$data/postgresql.conf" ||
    printf "\n# deploy/pg-ha.sh\ninclude_if_exists = 'pg-ha.conf'\n" | as_pg tee -a "$data/postgresql.conf" >/dev/null
}

# Per node, on the command line: its port and socket, and whom it follows when it has
# standby.signal (primary_conninfo and primary_slot_name are ignored on a primary). Its
# application_name is its node name, which synchronous_standby_names uses. The command line
# wins over postgresql.auto.conf, where pg_basebackup -R and pg_rewind -R write (and copy
# from the other node) a primary_conninfo; synchronous_standby_names is therefore not
# here (ALTER SYSTEM sets it).
node_opts() { # node
  local n=$1 o; o=$(other "$1")
  printf '%s ' "-p $(port_of "$n")" "-k $(sock_of "$n")" "-c cluster_name=pg-ha-$n" \
    "-c primary_conninfo='host=127.0.0.1 port=$(port_of "$o") user=postgres application_name=$n'" \
    "-c primary_slot_name=pg_ha_$n"
}

ensure_pg_user() {
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  fi
}

prepare_node_dir() { # node
  local dir; dir=$(data_root)/$1
  chmod o+x "$STACK" 2>/dev/null || true
  mkdir -p "$dir/sock"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir" "$dir/sock"; fi
}

init_primary() { # node
  local n=$1 data; data=$(data_of "$1")
  prepare_node_dir "$n"
  log "initdb $data (node $n, primary)"
  as_pg "$(pg_bin)/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
    >"$STACK/logs/pg-ha-initdb.log" 2>&1 || die "initdb failed: $STACK/logs/pg-ha-initdb.log"
  # Trust on 127.0.0.1 (and the node's socket), replication included; copied to the
  # standby by pg_basebackup.
  as_pg tee "$data/pg_hba.conf" >/dev/null <<'EOF'
# deploy/pg-ha.sh: local stack only, trust on the loopback, replication included.
local   all          all                 trust
local   replication  all                 trust
host    all          all   127.0.0.1/32  trust
host    replication  all   127.0.0.1/32  trust
EOF
  echo "$n" >"$HA/primary"
}

start_node() { # node [try: return 1 instead of exiting when it does not start]
  local n=$1 try=${2:-} data pid; data=$(data_of "$1")
  if pid=$(node_pid "$n"); then log "node $n already running (pid $pid)"; return 0; fi
  has_data "$n" || die "node $n has no data ($data)"
  prepare_node_dir "$n"
  local role=primary; is_standby_data "$n" && role=standby
  clear_stale_lock "$n"
  log "starting node $n ($role) on 127.0.0.1:$(port_of "$n")"
  write_node_conf "$n"
  # Without -l the server writes to pg_ctl's standard output: the log file, opened here by
  # whoever runs the script, so the postgres user needs no write access to $STACK/logs.
  printf '\n=== %s pg_ctl start (%s)\n' "$(date -Is)" "$role" >>"$(log_of "$n")"
  as_pg "$(pg_bin)/pg_ctl" -D "$data" -w -t 120 start -o "$(node_opts "$n")" >>"$(log_of "$n")" 2>&1 </dev/null 9>&- || {
    tail -n 20 "$(log_of "$n")" >&2
    if [ "$try" = try ]; then log "node $n did not start: $(log_of "$n")"; stop_node "$n"; return 1; fi
    die "node $n did not start: $(log_of "$n")"
  }
  head -n 1 "$data/postmaster.pid" >"$(pidfile_of "$n")"
}

stop_node() { # node
  local n=$1 pid
  pid=$(node_pid "$n") || { rm -f "$(pidfile_of "$n")"; return 0; }
  log "stopping node $n (pid $pid)"
  as_pg "$(pg_bin)/pg_ctl" -D "$(data_of "$n")" -m fast -w -t 60 stop >>"$(log_of "$n")" 2>&1 || true
  local i
  if pid_running "$pid"; then kill -INT "$pid" 2>/dev/null || true; fi
  for ((i = 0; i < 100; i++)); do pid_running "$pid" || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$(pidfile_of "$n")"
  for ((i = 0; i < 100; i++)); do [ -z "$(node_procs "$n")" ] && return 0; sleep 0.1; done
  log "warning: processes of node $n still run: $(node_procs "$n")"
}

# The standby's physical slot on the primary, created reserving WAL from now. With
# fresh=1 an existing one is dropped first (it would keep WAL from an older life).
ensure_slot() { # primary standby fresh
  local p=$1 s=$2 fresh=${3:-0}
  if [ "$fresh" = 1 ]; then
    q "$p" "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = 'pg_ha_$s' and not active" >/dev/null ||
      die "cannot drop slot pg_ha_$s on node $p"
  fi
  [ "$(q "$p" "select count(*) from pg_replication_slots where slot_name = 'pg_ha_$s'")" = 1 ] && return 0
  log "replication slot pg_ha_$s on node $p"
  q "$p" "select pg_create_physical_replication_slot('pg_ha_$s', true)" >/dev/null || die "cannot create slot pg_ha_$s on node $p"
}

streaming() { # primary standby
  [ "$(q "$1" "select state from pg_stat_replication where application_name = '$2'" || true)" = streaming ]
}

wait_streaming() { # primary standby seconds
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    streaming "$1" "$2" && return 0
    node_pid "$2" >/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# A fresh copy of the primary: pg_basebackup -R (standby.signal, primary_conninfo) with the
# standby's slot, WAL streamed alongside.
basebackup_node() { # node primary
  local n=$1 p=$2 data; data=$(data_of "$1")
  local root; root=$(data_root)
  { [ -n "$root" ] && [ -n "$n" ]; } || die "no data folder"
  rm -rf "$data"
  prepare_node_dir "$n"
  ensure_slot "$p" "$n" 1
  log "pg_basebackup node $n from node $p"
  as_pg "$(pg_bin)/pg_basebackup" -d "host=127.0.0.1 port=$(port_of "$p") user=postgres application_name=$n-basebackup" \
    -D "$data" -R -S "pg_ha_$n" -X stream -c fast -w >>"$(log_of "$n")" 2>&1 ||
    die "pg_basebackup of node $n from node $p failed: $(log_of "$n")"
}

# The crashed old primary rewound onto the new primary's timeline. pg_rewind finishes the
# target's crash recovery itself (single-user mode) first. The new primary checkpoints
# first: until then its pg_control still names the old timeline and pg_rewind would find
# nothing to do. Slots the node had as a primary are dropped (a slot on a standby keeps its
# WAL forever).
rewind_node() { # node primary
  local n=$1 p=$2 data; data=$(data_of "$1")
  ensure_slot "$p" "$n" 1
  q "$p" checkpoint >/dev/null || return 1
  clear_stale_lock "$n"
  log "pg_rewind node $n onto node $p"
  printf '\n=== %s pg_rewind onto node %s\n' "$(date -Is)" "$p" >>"$(log_of "$n")"
  as_pg "$(pg_bin)/pg_rewind" -D "$data" -R \
    --source-server="host=127.0.0.1 port=$(port_of "$p") user=postgres dbname=postgres application_name=$n-rewind" \
    >>"$(log_of "$n")" 2>&1 || { log "pg_rewind of node $n failed (see $(log_of "$n"))"; return 1; }
  as_pg touch "$data/standby.signal" || return 1
  find "$data/pg_replslot" -mindepth 1 -delete
}

# The node (not running) as a streaming standby of the primary: pg_rewind when it has data,
# a fresh base backup when it has none or the rewound node does not stream within 60 s.
rebuild_standby() { # node primary
  local n=$1 p=$2
  if has_data "$n" && rewind_node "$n" "$p"; then
    if start_node "$n" try && wait_streaming "$p" "$n" 60; then
      log "node $n streams from node $p (rewound)"; return 0
    fi
    log "node $n does not stream after pg_rewind: taking a fresh base backup"
    stop_node "$n"
  fi
  basebackup_node "$n" "$p"
  start_node "$n"
  wait_streaming "$p" "$n" 120 || die "node $n does not stream from node $p: $(log_of "$n")"
  log "node $n streams from node $p (base backup)"
}

# --- synchronous replication ---

sync_wanted() {
  case "${NOTIFY_PG_HA_SYNC:-}" in
    1) echo on ;;
    0) echo off ;;
    *) cat "$HA/sync" 2>/dev/null || echo off ;;
  esac
}

# Makes the primary's synchronous_standby_names match the wanted mode: the standby's name
# while it streams and sync is on, else empty (non-strict, see the header).
apply_sync() { # primary standby on|off
  local p=$1 s=$2 mode=$3 want='' cur
  echo "$mode" >"$HA/sync"
  if [ "$mode" = on ]; then
    if streaming "$p" "$s"; then want=$s; else log "sync on: node $s does not stream, synchronous_standby_names stays empty until it does"; fi
  fi
  cur=$(q "$p" 'show synchronous_standby_names') || die "node $p does not answer"
  [ "$cur" = "$want" ] && return 0
  log "node $p: synchronous_standby_names = '$want'"
  { q "$p" "alter system set synchronous_standby_names = '$want'" >/dev/null &&
    q "$p" 'select pg_reload_conf()' >/dev/null; } || die "cannot set synchronous_standby_names on node $p"
  local expect=async i
  [ -n "$want" ] && expect=sync
  streaming "$p" "$s" || return 0
  for ((i = 0; i < 50; i++)); do
    [ "$(q "$p" "select sync_state from pg_stat_replication where application_name = '$s'" || true)" = "$expect" ] && return 0
    sleep 0.2
  done
  log "node $s's sync_state is not $expect after 10 s"
}

# --- HAProxy ---

write_haproxy() {
  local user=''
  # A server is up only when it answers as a primary; one failed check takes it out and
  # closes its sessions (the pools then reconnect and land on the new primary).
  cat >"$HA/check-primary.sh" <<'EOF'
#!/bin/sh
# HAProxy external check (deploy/pg-ha.sh): $3 server address, $4 port. Healthy only when
# the server accepts a connection and is not in recovery (a primary).
r=$(PGCONNECT_TIMEOUT=2 /usr/bin/psql -X -w -h "$3" -p "$4" -U postgres -d postgres -tAc 'select pg_is_in_recovery()' 2>/dev/null) || exit 1
[ "$r" = f ]
EOF
  chmod 755 "$HA/check-primary.sh"
  # As Debian's haproxy user when that user can run the check (it cannot reach a stack
  # folder under /root, say: then as root).
  if [ "$(id -u)" = 0 ] && id haproxy >/dev/null 2>&1; then
    if runuser -u haproxy -- test -x "$HA/check-primary.sh"; then
      user=$'  user haproxy\n  group haproxy'
    else
      log "the haproxy user cannot reach $HA: haproxy runs as root"
    fi
  fi
  cat >"$HA/haproxy.cfg" <<EOF
# Generated by deploy/pg-ha.sh up.
global
  external-check
  insecure-fork-wanted
  nbthread 1
  maxconn 4000
$user
  log stderr format iso local0 info
  stats socket $HA/haproxy.sock mode 600 level operator

defaults
  mode tcp
  log global
  # Logged: server state changes, and sessions that ended in an error (not every connect).
  option tcplog
  option dontlognull
  option dontlog-normal
  # No retry: a connect refused by a dead node not yet marked down fails at once and the
  # client's pool tries again (a retry would wait a second first: routed_after_s was 2.4 s
  # instead of 0.5 s with the default).
  retries 0
  timeout connect 2s
  # Pools keep their connections for hours.
  timeout client 24h
  timeout server 24h
  timeout check 2s

listen postgres
  bind 127.0.0.1:$FRONT
  option external-check
  external-check path "/usr/bin:/bin"
  external-check command $HA/check-primary.sh
  default-server inter 500ms fall 1 rise 1 on-marked-down shutdown-sessions
  server a 127.0.0.1:$(port_of a) check
  server b 127.0.0.1:$(port_of b) check
EOF
}

start_haproxy() {
  local f=$STACK/pids/pg-ha-haproxy.pid
  if alive "$f"; then log "haproxy already running (pid $(cat "$f"))"; return 0; fi
  command -v haproxy >/dev/null || apt_install haproxy
  write_haproxy
  haproxy -c -q -f "$HA/haproxy.cfg" >>"$STACK/logs/pg-ha-haproxy.log" 2>&1 ||
    die "haproxy refuses $HA/haproxy.cfg: $STACK/logs/pg-ha-haproxy.log"
  log "starting haproxy on 127.0.0.1:$FRONT"
  setsid haproxy -db -f "$HA/haproxy.cfg" >>"$STACK/logs/pg-ha-haproxy.log" 2>&1 </dev/null 9>&- &
  echo $! >"$f"
}

# The node new connections through the front reach (fails when none).
routed_to() {
  local port; port=$(q front 'select inet_server_port()') || return 1
  node_of_port "$port"
}

wait_routed() { # node seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(q front 'select pg_is_in_recovery()' || true)" = f ] && [ "$(routed_to || true)" = "$1" ] && return 0
    alive "$STACK/pids/pg-ha-haproxy.pid" || { tail -n 20 "$STACK/logs/pg-ha-haproxy.log" >&2; die "haproxy exited"; }
    sleep 0.1
  done
  return 1
}

haproxy_servers() { # "a UP, b DOWN" from the stats socket, when socat is there
  command -v socat >/dev/null && [ -S "$HA/haproxy.sock" ] || return 1
  echo 'show stat' | socat -t 2 - "UNIX-CONNECT:$HA/haproxy.sock" 2>/dev/null |
    awk -F, '$1 == "postgres" && ($2 == "a" || $2 == "b") { s = s (s ? ", " : "") $2 " " $18 } END { if (s == "") exit 1; print s }'
}

# --- verbs ---

print_env() {
  cat <<EOF
export NOTIFY_DATABASE_URL=postgres://postgres@127.0.0.1:$FRONT/notify
export NOTIFY_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$FRONT/postgres
export NOTIFY_PG_HA_FRONT=127.0.0.1:$FRONT
EOF
}

up() {
  local pid
  [ -n "$(pg_bin)" ] || apt_install postgresql
  command -v psql >/dev/null || apt_install postgresql-client
  ensure_pg_user
  local p s
  if p=$(live_primary); then :; else p=$(data_primary); fi
  s=$(other "$p")
  has_data "$p" || { has_data "$s" && die "node $p has no data but node $s has: clean, or rebuild by hand"; init_primary "$p"; }
  start_node "$p"
  [ "$(role_of "$p")" = primary ] || die "node $p does not answer as primary: $(log_of "$p")"
  if ! has_data "$s"; then
    basebackup_node "$s" "$p"
  elif ! is_standby_data "$s"; then
    # Both were primaries (an interrupted failover): the running primary, the later
    # timeline or the state file chose $p.
    stop_node "$s"
    rebuild_standby "$s" "$p"
  fi
  if pid=$(node_pid "$s"); then
    log "node $s already running (pid $pid)"
  else
    # A slot lost with the primary's data is created again; if the standby needs WAL from
    # before it, it does not stream and is copied afresh below.
    ensure_slot "$p" "$s"
    start_node "$s"
  fi
  [ "$(role_of "$s")" = standby ] || die "node $s does not answer as standby: $(log_of "$s")"
  if ! wait_streaming "$p" "$s" 60; then
    log "node $s does not stream from node $p: taking a fresh base backup"
    stop_node "$s"
    basebackup_node "$s" "$p"
    start_node "$s"
    wait_streaming "$p" "$s" 120 || die "node $s does not stream from node $p: $(log_of "$s")"
  fi
  start_haproxy
  wait_routed "$p" 30 || die "the front 127.0.0.1:$FRONT does not reach node $p: $STACK/logs/pg-ha-haproxy.log"
  echo "$p" >"$HA/primary"
  apply_sync "$p" "$s" "$(sync_wanted)"
  [ "$(q front "select count(*) from pg_database where datname = 'notify'")" = 1 ] ||
    { log "create database notify"; q front 'create database notify' >/dev/null || die "create database notify failed"; }
  print_env >"$HA/env"
  log "ready: primary $p, standby $s, front 127.0.0.1:$FRONT; environment in $HA/env"
}

down() {
  stop_pid pg-ha-haproxy
  # The primary first: a fast shutdown sends its last WAL to the standby before it ends.
  local p; p=$(live_primary 2>/dev/null || cat "$HA/primary" 2>/dev/null || echo a)
  case "$p" in a | b) ;; *) p=a ;; esac
  stop_node "$p"
  stop_node "$(other "$p")"
}

status() {
  local n pid
  for n in "${NODES[@]}"; do
    if pid=$(node_pid "$n"); then
      echo "node $n: $(role_of "$n"), port $(port_of "$n"), pid $pid"
    else
      echo "node $n: stopped, port $(port_of "$n")$(has_data "$n" || echo ', no data')"
    fi
  done
  local p
  if p=$(live_primary); then
    local rows
    rows=$(q "$p" "select application_name || ': state ' || state || ', sync_state ' || sync_state
      || ', replay_lag ' || coalesce(replay_lag::text, '0 (idle)')
      || ', behind ' || pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))
      from pg_stat_replication where application_name in ('a', 'b') order by 1" || true)
    if [ -n "$rows" ]; then
      while IFS= read -r r; do echo "replication $p -> $r"; done <<<"$rows"
    else
      echo "replication: no standby streams from node $p"
    fi
    echo "synchronous_standby_names on $p: '$(q "$p" 'show synchronous_standby_names' || true)' (sync $(sync_wanted))"
  else
    echo "replication: no primary answers"
  fi
  local f=$STACK/pids/pg-ha-haproxy.pid
  if alive "$f"; then
    local r servers
    r=$(routed_to || echo none)
    servers=$(haproxy_servers || echo '?')
    echo "haproxy: pid $(cat "$f"), 127.0.0.1:$FRONT routes to $r (checks: $servers)"
  else
    echo "haproxy: stopped"
  fi
}

failover() {
  local p s ra rb
  ra=$(role_of a) rb=$(role_of b)
  if [ "$ra" = primary ] || [ "$rb" = primary ]; then
    if [ "$ra" = primary ]; then p=a; else p=b; fi
    s=$(other "$p")
    [ "$(role_of "$s")" = standby ] || die "node $s is not a running standby (node $s: $(role_of "$s"))"
    streaming "$p" "$s" || log "warning: node $s does not stream right now; it may lack recent commits"
  elif [ "$ra" = standby ] || [ "$rb" = standby ]; then
    # The primary crashed (or hangs) already: promote the standby all the same.
    if [ "$ra" = standby ]; then s=a; else s=b; fi
    p=$(other "$s")
    log "node $p does not answer as primary ($(role_of "$p"))"
  else
    die "no node answers as primary or standby (\`$0 status\`; \`$0 up\` starts them)"
  fi
  alive "$STACK/pids/pg-ha-haproxy.pid" || die "haproxy is not running (\`$0 up\`)"
  local sync; sync=$(sync_wanted)
  # The node to promote must not wait for a synchronous standby it will not have for a
  # while: clear the setting it may have copied with its base backup (ALTER SYSTEM works on a
  # standby, and takes effect there at once).
  { q "$s" "alter system set synchronous_standby_names = ''" >/dev/null && q "$s" 'select pg_reload_conf()' >/dev/null; } ||
    die "cannot clear synchronous_standby_names on node $s"
  local pid t0; t0=$(now)
  if pid=$(node_pid "$p"); then
    log "kill -9 node $p's postmaster (pid $pid)"
    kill -9 "$pid"
  fi
  rm -f "$(pidfile_of "$p")"
  log "promoting node $s"
  [ "$(q "$s" 'select pg_promote(true, 60)')" = t ] || die "promotion of node $s failed: $(log_of "$s")"
  echo "$s" >"$HA/primary"
  log "node $s promoted after $(since "$t0")s"
  wait_routed "$s" 60 || die "haproxy does not route to node $s after 60 s"
  local routed; routed=$(since "$t0")
  log "haproxy routes to node $s after ${routed}s"
  # The dead postmaster's children end when they notice its death; pg_rewind's crash
  # recovery needs them gone (they hold its shared memory).
  local i
  for ((i = 0; i < 300; i++)); do [ -z "$(node_procs "$p")" ] && break; sleep 0.1; done
  [ -z "$(node_procs "$p")" ] || die "processes of node $p's dead postmaster still run: $(node_procs "$p")"
  rebuild_standby "$p" "$s"
  local back; back=$(since "$t0")
  apply_sync "$s" "$p" "$sync"
  echo "pg-ha: failover primary=$p->$s routed_after_s=$routed standby_back_after_s=$back"
}

sync_cmd() { # on|off
  local p s
  p=$(live_primary) || die "no node answers as primary"
  s=$(other "$p")
  apply_sync "$p" "$s" "$1"
  echo "pg-ha: sync $1 on node $p: synchronous_standby_names='$(q "$p" 'show synchronous_standby_names')', $s $(q "$p" "select coalesce(max(sync_state), 'not streaming') from pg_stat_replication where application_name = '$s'")"
}

clean() {
  down
  local root; root=$(data_root)
  case "$root" in */pg-ha) ;; *) die "refusing to delete $root" ;; esac
  if [ "$root" = "$HA" ]; then log "deleting $HA"; else log "deleting $root and $HA"; fi
  rm -rf "$root" "$HA"
}

locked() { # verb... : one changing verb at a time (the servers started close fd 9)
  mkdir -p "$STACK/logs" "$STACK/pids" "$HA"
  exec 9>"$STACK/pids/pg-ha.lock"
  flock -n 9 || die "another deploy/pg-ha.sh is running (lock $STACK/pids/pg-ha.lock)"
  "$@"
}

cmd=${1:-}
case "$cmd" in
  up) locked up ;;
  down) locked down ;;
  clean) locked clean ;;
  status) status ;;
  env) print_env ;;
  failover) locked failover ;;
  sync)
    case "${2:-}" in
      on | off) locked sync_cmd "$2" ;;
      *) echo "usage: $0 sync on|off" >&2; exit 64 ;;
    esac ;;
  *) echo "usage: $0 up|down|clean|status|env|failover|sync on|off" >&2; exit 64 ;;
esac
