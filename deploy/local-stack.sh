#!/usr/bin/env bash
# Local stack without Docker: PostgreSQL, RabbitMQ, MailDev and provider-sim as background
# processes with data, logs and pid files under one folder this script owns.
#
#   deploy/local-stack.sh up       install what is missing, start everything, wait until ready
#   deploy/local-stack.sh down     stop everything this script started (by pid; rabbitmq-cluster too)
#   deploy/local-stack.sh stop S   stop one service (postgres, rabbitmq, maildev, provider-sim)
#   deploy/local-stack.sh status   show what runs
#   deploy/local-stack.sh env      print the environment the services and tests need
#   deploy/local-stack.sh sweep    delete what earlier test and bench runs left on the
#                                  running stack and no one uses: databases `notify_t_*` and
#                                  `notify_cost_*` with no connection, queues `t<id>.` whose
#                                  database `notify_t_<id>` is gone, queues `bench-<unix time>.`
#                                  over two hours old. Each idle quorum queue
#                                  is a Raft member that keeps ticking and each database gets
#                                  autovacuum rounds: 1,444 leftover queues and 64 databases
#                                  took 10 % of a core at rest (docs/scaling.md, 2026-12-05).
#                                  `make test` runs it before the tests, `make bench` before
#                                  measuring
#   deploy/local-stack.sh examples install only the examples' dependencies (receivers, gRPC clients)
#   deploy/local-stack.sh install PKG...  install Debian packages other scripts need (apt-get,
#                                  as root; deploy/image-check.sh: podman, runc)
#   deploy/local-stack.sh pgbouncer up|down|status|env
#                                  pgbouncer (Debian's package) in transaction pooling mode in
#                                  front of the stack's Postgres (docs/pooling.md); never started
#                                  by `up`, `make up` or `make test`. `env` prints the settings
#                                  that route the binaries through it (also in $STACK/pgbouncer/env)
#   deploy/local-stack.sh rabbitmq-cluster VERB
#                                  three clustered RabbitMQ nodes (numbered 1 to 3) beside the
#                                  stack's single one, for failover tests; never started by `up`,
#                                  `make up` or `make test`. VERB:
#     up         start the 3 nodes (a blank cluster: node 1, then 2 and 3 join it; nodes with
#                data: all together, each waits for the others), wait until all 3 run; idempotent
#     down       stop all 3 (SIGTERM to each node's Erlang VM, by pid) and the cluster's epmd
#     status     one line per node: running or stopped, pid, ports
#     env        print the NOTIFY_AMQP_URL listing the 3 nodes
#     leader Q   number of the node leading quorum queue Q (exit 1 if unknown)
#     members Q  numbers of the nodes with a replica of Q, one a line
#     kill N     SIGKILL node N's Erlang VM (beam.smp: a crash), wait until it is gone
#     start N    start node N again, wait until its AMQP port accepts, it has rejoined the
#                cluster and its quorum queue replicas are back online
#                                  `leader` and `members` ask the management API (enabled on these
#                                  nodes only) of the first running node: well under a second where
#                                  the CLI (rabbitmqctl, a second Erlang VM) takes one or more.
#                                  Node i: AMQP on NOTIFY_AMQP_CLUSTER_PORT + 11*(i-1), management
#                                  API on that + 5, Erlang distribution + 20000, CLI + 30000..+30010;
#                                  name notifyc<port>@localhost; data in $STACK/rabbitmq-cluster/
#                                  node<i>, log $STACK/logs/rabbitmq-c<i>.log, pid (beam.smp)
#                                  $STACK/pids/rabbitmq-c<i>.pid
#
# Settings (environment, with defaults):
#   NOTIFY_STACK_DIR  folder for data, logs and pids   (<repo>/.stack)
#   NOTIFY_PG_PORT    PostgreSQL port                   (55432)
#   NOTIFY_AMQP_PORT  RabbitMQ AMQP port                (5692; Erlang distribution = +20000, CLI tools +30000..+30010)
#   NOTIFY_SMTP_PORT  MailDev SMTP port                 (51025)
#   NOTIFY_MAILDEV_WEB_PORT  MailDev web UI / REST API  (51080)
#   NOTIFY_SIM_PORT   provider-sim HTTP port            (58080)
#   NOTIFY_HTTP_PORT  where scripts start http-api      (58090; only written to the env)
#   NOTIFY_AMQP_CLUSTER_PORT  AMQP port of rabbitmq-cluster's node 1 (NOTIFY_AMQP_PORT + 100;
#                     node i on + 11*(i-1): 5792, 5803, 5814 by default)
#   NOTIFY_AMQP_CLUSTER_EPMD_PORT  the cluster's own epmd (NOTIFY_AMQP_CLUSTER_PORT + 10)
#   NOTIFY_PGBOUNCER_PORT  pgbouncer port               (NOTIFY_PG_PORT + 1)
#   NOTIFY_PGBOUNCER_POOL_SIZE  server connections per database and user (150 in session
#                     mode, 40 in transaction mode)
#   NOTIFY_PGBOUNCER_POOL_MODE  session (default) or transaction; with Debian 12's 1.18,
#                     transaction pooling mixes up sqlx's prepared statements (docs/pooling.md)
#   PROVIDER_SIM_BIN  provider-sim binary (built with cargo when unset)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
PG_PORT=${NOTIFY_PG_PORT:-55432}
AMQP_PORT=${NOTIFY_AMQP_PORT:-5692}
DIST_PORT=$((AMQP_PORT + 20000))
SMTP_PORT=${NOTIFY_SMTP_PORT:-51025}
MAILDEV_WEB_PORT=${NOTIFY_MAILDEV_WEB_PORT:-51080}
SIM_PORT=${NOTIFY_SIM_PORT:-58080}
RABBIT_NODE=notify${AMQP_PORT}@localhost
MAILDEV_VERSION=3.0.0
PLAYWRIGHT_VERSION=1.64.1
HTTP_PORT=${NOTIFY_HTTP_PORT:-58090}
PGB_PORT=${NOTIFY_PGBOUNCER_PORT:-$((PG_PORT + 1))}
CLUSTER_PORT=${NOTIFY_AMQP_CLUSTER_PORT:-$((AMQP_PORT + 100))}
CLUSTER_EPMD_PORT=${NOTIFY_AMQP_CLUSTER_EPMD_PORT:-$((CLUSTER_PORT + 10))}
PGB_POOL_MODE=${NOTIFY_PGBOUNCER_POOL_MODE:-session}
if [ "$PGB_POOL_MODE" = transaction ]; then PGB_POOL_SIZE=${NOTIFY_PGBOUNCER_POOL_SIZE:-40}; else PGB_POOL_SIZE=${NOTIFY_PGBOUNCER_POOL_SIZE:-150}; fi
LINE_TOKEN=${NOTIFY_LINE_CHANNEL_TOKEN:-local-line-channel-access-token}
LINE_SECRET=${NOTIFY_LINE_CHANNEL_SECRET:-local-line-channel-secret}

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=deploy/host.sh
source "$here/host.sh"

install_missing() {
  local pkgs=()
  [ -n "$(pg_bin)" ] || pkgs+=(postgresql)
  command -v psql >/dev/null || pkgs+=(postgresql-client)
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || pkgs+=(rabbitmq-server)
  command -v openssl >/dev/null || pkgs+=(openssl)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v node >/dev/null || pkgs+=(nodejs npm)
  command -v python3 >/dev/null || pkgs+=(python3)
  # The example receivers' venv (Debian's python3 has venv/ensurepip in python3-venv).
  python3 -c 'import ensurepip' >/dev/null 2>&1 || pkgs+=(python3-venv)
  # Browser tests: Debian's Chromium, driven by playwright-core (below).
  [ -x /usr/bin/chromium ] || pkgs+=(chromium)
  # Thai glyphs in the screenshots.
  [ -d /usr/share/fonts/truetype/tlwg ] || pkgs+=(fonts-thai-tlwg)
  [ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"
  if [ ! -d "$STACK/browser/node_modules/playwright-core" ]; then
    log "npm install playwright-core@$PLAYWRIGHT_VERSION"
    mkdir -p "$STACK/browser"
    (cd "$STACK/browser" && npm install --no-audit --no-fund --loglevel=error "playwright-core@$PLAYWRIGHT_VERSION" \
      >"$STACK/logs/npm-browser.log" 2>&1) || die "npm install playwright-core failed: $STACK/logs/npm-browser.log"
  fi
  if [ ! -x "$STACK/maildev/node_modules/.bin/maildev" ]; then
    log "npm install maildev@$MAILDEV_VERSION"
    mkdir -p "$STACK/maildev"
    (cd "$STACK/maildev" && npm install --no-audit --no-fund --loglevel=error "maildev@$MAILDEV_VERSION" \
      >"$STACK/logs/npm.log" 2>&1) || die "npm install maildev failed: $STACK/logs/npm.log"
  fi
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# The examples (examples/python, examples/node: the webhook receivers and their reference
# libraries, the gRPC clients and theirs), for the tests that run them: a venv at
# $STACK/examples/venv made anew when missing or when a requirements file changed, and
# `npm ci` in examples/node when node_modules is missing or the lockfile changed (each
# install's hash stored beside it). Two pip runs: requirements.txt is hash-checked, and
# pip checks hashes for every package of a run once one file has them.
install_examples() {
  local req=$repo/examples/python/requirements.txt grpc_req=$repo/examples/python/requirements-grpc.txt
  local venv=$STACK/examples/venv want
  want="$(sha "$req") $(sha "$grpc_req")"
  mkdir -p "$STACK/examples" "$STACK/logs"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    log "python venv for the examples: $venv"
    rm -rf "$venv"
    { python3 -m venv "$venv" \
        && "$venv/bin/pip" install --disable-pip-version-check -q -r "$req" \
        && "$venv/bin/pip" install --disable-pip-version-check -q -r "$grpc_req"; } \
      >"$STACK/logs/examples-pip.log" 2>&1 || die "pip install of the examples' requirements failed: $STACK/logs/examples-pip.log"
    echo "$want" >"$venv/.requirements.sha256"
  fi
  local node=$repo/examples/node
  if [ ! -d "$node/node_modules" ] || [ "$(cat "$node/node_modules/.lock.sha256" 2>/dev/null)" != "$(sha "$node/package-lock.json")" ]; then
    log "npm ci in $node"
    (cd "$node" && npm ci --no-audit --no-fund --loglevel=error >"$STACK/logs/examples-npm.log" 2>&1) \
      || die "npm ci in $node failed: $STACK/logs/examples-npm.log"
    sha "$node/package-lock.json" >"$node/node_modules/.lock.sha256"
  fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() { # name seconds command...
  local name=$1 secs=$2; shift 2
  local i pidfile=$STACK/pids/$name.pid
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if [ -f "$pidfile" ] && ! alive "$pidfile"; then
      tail -n 20 "$STACK/logs/$name.log" >&2 2>/dev/null || true
      die "$name exited during start (logs in $STACK/logs)"
    fi
    sleep 0.2
  done
  die "$name not ready after ${secs}s (logs in $STACK/logs)"
}

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# Postgres runs as the postgres user when we are root; it must be able to reach its data
# folder. When the stack folder is not reachable for it (a checkout under /root, say), its
# data lives under /var/lib/notify-local/<hash of the stack folder> instead.
pg_dir() {
  if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$STACK"; then
    echo "/var/lib/notify-local/$(printf '%s' "$STACK" | sha1sum | cut -c1-12)/pg"
  else
    echo "$STACK/pg"
  fi
}

start_postgres() {
  local bin; bin=$(pg_bin)
  if alive "$STACK/pids/postgres.pid"; then log "postgres already running"; return; fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  fi
  chmod o+x "$STACK" 2>/dev/null || true
  local dir; dir=$(pg_dir)
  local data=$dir/data sock=$dir/sock
  mkdir -p "$dir" "$sock"
  [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
      >"$STACK/logs/initdb.log" 2>&1 || die "initdb failed: $STACK/logs/initdb.log"
  fi
  log "starting postgres on 127.0.0.1:$PG_PORT"
  # pg_stat_statements (preloaded, counting statements nested in functions too) feeds the
  # per-delivery cost table of `make bench` (crates/notifyctl/src/bench/cost.rs), which runs
  # CREATE EXTENSION itself; track_io_timing adds the time spent reading and writing blocks
  # to it (blk_read_time, blk_write_time). That costs two clock reads per block, negligible
  # with Linux's vDSO clock (check with pg_test_timing).
  as_pg "$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 start \
    -o "-p $PG_PORT -k $sock -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=256MB -c max_wal_size=4GB -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c track_io_timing=on" \
    >"$STACK/logs/pg_ctl.log" 2>&1 || die "postgres did not start: $dir/postgres.log"
  head -n 1 "$data/postmaster.pid" >"$STACK/pids/postgres.pid"
  wait_for postgres 30 psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c 'select 1'
  psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc "select 1 from pg_database where datname='notify'" |
    grep -q 1 || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc 'create database notify' >/dev/null
}

rabbit_env() {
  export HOME=$STACK/rabbitmq/home
  export RABBITMQ_NODENAME=$RABBIT_NODE
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$AMQP_PORT
  export RABBITMQ_DIST_PORT=$DIST_PORT
  export RABBITMQ_MNESIA_BASE=$STACK/rabbitmq/mnesia
  export RABBITMQ_LOG_BASE=$STACK/rabbitmq/log
  export RABBITMQ_PID_FILE=$STACK/rabbitmq/rabbit.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$STACK/rabbitmq/enabled_plugins
  export RABBITMQ_CONFIG_FILE=$STACK/rabbitmq/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$STACK/rabbitmq/advanced.config
  export RABBITMQ_CONF_ENV_FILE=$STACK/rabbitmq/rabbitmq-env.conf
}

start_rabbitmq() {
  if alive "$STACK/pids/rabbitmq.pid"; then log "rabbitmq already running"; return; fi
  mkdir -p "$STACK/rabbitmq/home" "$STACK/rabbitmq/mnesia" "$STACK/rabbitmq/log"
  cat >"$STACK/rabbitmq/rabbitmq.conf" <<EOF
loopback_users = none
EOF
  echo '[].' >"$STACK/rabbitmq/enabled_plugins"
  # No scheduler busy-waiting: by default an idle Erlang scheduler spins before it sleeps,
  # which on a host whose few cores Postgres and the platform share is CPU taken from them
  # (erl(1) +sbwt; Red Hat OpenStack ships RabbitMQ with +sbwt none for the same reason).
  # Measured with `make bench`: see docs/scaling.md (2026-12-03, batched messages).
  echo 'SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"' \
    >"$STACK/rabbitmq/rabbitmq-env.conf"
  log "starting rabbitmq on 127.0.0.1:$AMQP_PORT"
  (
    rabbit_env
    exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$STACK/logs/rabbitmq.log" 2>&1 </dev/null
  ) &
  echo $! >"$STACK/pids/rabbitmq.pid"
  # Ready when its AMQP listener accepts a connection: the broker opens it at the end of
  # its boot. Not `rabbitmqctl wait`: that CLI is a second Erlang VM, and on a loaded
  # machine its own start alone took over a minute (it was killed by its timeout while
  # the broker was up).
  wait_for rabbitmq 180 bash -c "exec 3<>/dev/tcp/127.0.0.1/$AMQP_PORT"
}

start_maildev() {
  if alive "$STACK/pids/maildev.pid"; then log "maildev already running"; return; fi
  log "starting maildev: smtp 127.0.0.1:$SMTP_PORT, web http://127.0.0.1:$MAILDEV_WEB_PORT"
  setsid "$STACK/maildev/node_modules/.bin/maildev" --smtp "$SMTP_PORT" --web "$MAILDEV_WEB_PORT" \
    --ip 127.0.0.1 --mail-directory "$STACK/maildev/mail" >"$STACK/logs/maildev.log" 2>&1 </dev/null &
  echo $! >"$STACK/pids/maildev.pid"
  wait_for maildev 30 curl -fsS "http://127.0.0.1:$MAILDEV_WEB_PORT/api/email"
}

make_fcm_key() {
  local keys=$STACK/keys
  [ -f "$keys/fcm-service-account.json" ] && return
  mkdir -p "$keys"
  log "generating a local FCM service-account key"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$keys/fcm-key.pem" 2>/dev/null
  openssl pkey -in "$keys/fcm-key.pem" -pubout -out "$keys/fcm-public.pem"
  python3 - "$keys" "$SIM_PORT" <<'EOF'
import json, sys
keys, port = sys.argv[1], sys.argv[2]
key = open(f"{keys}/fcm-key.pem").read()
json.dump({
    "type": "service_account",
    "project_id": "notify-local",
    "private_key_id": "local-1",
    "private_key": key,
    "client_email": "notify@notify-local.iam.gserviceaccount.com",
    "client_id": "1",
    "token_uri": f"http://127.0.0.1:{port}/token",
}, open(f"{keys}/fcm-service-account.json", "w"), indent=2)
EOF
}

# An APNs token-signing key like Apple's .p8 (EC P-256, PKCS #8) and its public half for
# the simulator.
make_apns_key() {
  local keys=$STACK/keys
  [ -f "$keys/apns-key.p8" ] && return
  mkdir -p "$keys"
  log "generating a local APNs signing key"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$keys/apns-key.p8" 2>/dev/null
  openssl pkey -in "$keys/apns-key.p8" -pubout -out "$keys/apns-public.pem"
}

# A VAPID key pair for Web Push (RFC 8292: EC P-256), PKCS #8 like the APNs key.
make_vapid_key() {
  local keys=$STACK/keys
  [ -f "$keys/vapid-key.pem" ] && return
  mkdir -p "$keys"
  log "generating a local VAPID key"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$keys/vapid-key.pem" 2>/dev/null
}

start_sim() {
  local bin=${PROVIDER_SIM_BIN:-}
  if alive "$STACK/pids/provider-sim.pid"; then
    # A rebuilt simulator, or another build of it (release for `make bench` where `make up`
    # started the debug one: a debug simulator took 11 % of both cores in the end-to-end
    # phase), replaces the running one.
    local running
    running=$(readlink "/proc/$(cat "$STACK/pids/provider-sim.pid")/exe" 2>/dev/null || true)
    if [ -n "$bin" ] && { [ "$bin" -nt "$STACK/pids/provider-sim.pid" ] ||
      [ "$running" != "$(readlink -f "$bin")" ]; }; then
      log "provider-sim was rebuilt or is another build: restarting it"
      stop_pid provider-sim
    else
      log "provider-sim already running"; return
    fi
  fi
  if [ -z "$bin" ]; then
    log "building provider-sim"
    (cd "$repo" && cargo build -q -p provider-sim) || die "cargo build -p provider-sim failed"
    bin=${CARGO_TARGET_DIR:-$repo/target}/debug/provider-sim
  fi
  log "starting provider-sim on http://127.0.0.1:$SIM_PORT"
  SIM_ADDR=127.0.0.1:$SIM_PORT SIM_LINE_CHANNEL_TOKEN=$LINE_TOKEN SIM_LINE_CHANNEL_SECRET=$LINE_SECRET \
    SIM_FCM_PUBLIC_KEY_FILE=$STACK/keys/fcm-public.pem SIM_FCM_PROJECT_ID=notify-local \
    SIM_FCM_CLIENT_EMAIL=notify@notify-local.iam.gserviceaccount.com \
    SIM_APNS_PUBLIC_KEY_FILE=$STACK/keys/apns-public.pem SIM_APNS_KEY_ID=LOCALKEY01 \
    SIM_APNS_TEAM_ID=LOCALTEAM1 SIM_APNS_TOPIC=test.notify.app \
    setsid "$bin" >"$STACK/logs/provider-sim.log" 2>&1 </dev/null &
  echo $! >"$STACK/pids/provider-sim.pid"
  wait_for provider-sim 30 curl -fsS "http://127.0.0.1:$SIM_PORT/_sim/health"
}

# pgbouncer in front of the stack's Postgres (docs/pooling.md), in session or transaction
# pooling mode (NOTIFY_PGBOUNCER_POOL_MODE).
# It refuses to run as root, so it runs as the postgres user, like Postgres; its config,
# log and pid live under $STACK/pgbouncer.
pgbouncer_env() {
  cat <<EOF
export NOTIFY_DATABASE_URL=postgres://postgres@127.0.0.1:$PGB_PORT/notify
export NOTIFY_DATABASE_DIRECT_URL=postgres://postgres@127.0.0.1:$PG_PORT/notify
export NOTIFY_DATABASE_POOLER=pgbouncer
export NOTIFY_PGBOUNCER_URL=postgres://postgres@127.0.0.1:$PGB_PORT
EOF
}

start_pgbouncer() {
  alive "$STACK/pids/postgres.pid" || die "postgres is not running: run \`$0 up\` first"
  [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
  local bin=/usr/sbin/pgbouncer dir=$STACK/pgbouncer
  case "$PGB_POOL_MODE" in
    session | transaction) ;;
    *) die "NOTIFY_PGBOUNCER_POOL_MODE=$PGB_POOL_MODE: use session or transaction" ;;
  esac
  if alive "$STACK/pids/pgbouncer.pid"; then log "pgbouncer already running"; return; fi
  mkdir -p "$dir"
  # Local stack: Postgres trusts 127.0.0.1, so does the pooler; the user must still be
  # listed in auth_file. Production: auth_type = scram-sha-256 (docs/pooling.md).
  printf '"postgres" ""\n' >"$dir/userlist.txt"
  cat >"$dir/pgbouncer.ini" <<EOF
; Generated by deploy/local-stack.sh pgbouncer up; docs/pooling.md explains each setting.
[databases]
; Any database name (the tests create one per test) goes to the stack's Postgres under the
; same name. statement_timeout is set per server connection here: pgbouncer refuses the
; startup parameter "options" the binaries send when NOTIFY_DATABASE_POOLER is unset.
* = host=127.0.0.1 port=$PG_PORT connect_query='SET statement_timeout = 30000'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
admin_users = postgres
; session: a server connection per client connection, for as long as it stays open (the
; binaries' pools keep theirs; what is saved is Postgres backends of idle pools elsewhere).
; transaction: a server connection is lent for one transaction; session state (SET,
; session advisory locks, LISTEN, named and unnamed prepared statements across Sync
; messages) does not follow the client. With pgbouncer 1.18 sqlx 0.9 is not safe in that
; mode (measured: another client's statement executed): docs/pooling.md.
pool_mode = $PGB_POOL_MODE
; session mode: run when a client disconnects, so the next client does not find the
; last one's prepared statements (sqlx names them sqlx_s_1, sqlx_s_2, ... on every
; connection: a leftover one would collide), settings or advisory locks. transaction mode:
; not run (server_reset_query_always = 0), a transaction is expected to leave nothing.
server_reset_query = DISCARD ALL
; Server connections per (database, user). Session mode: a client connection keeps its
; server connection until it closes, so this must cover every client pool at once (ingest
; 16 and its event writer's 4, five workers and http-api 10 each, the bench's 8: 88), else
; clients wait for one;
; 150 stays below Postgres' max_connections (400). Transaction mode: the platform's
; transactions are short (group commits, batched claims and records), 40 serve them.
default_pool_size = $PGB_POOL_SIZE
; A burst (workers catching up after a broker restart) may take 10 more after 1 s waiting.
reserve_pool_size = 10
reserve_pool_timeout = 1
; Client connections (every replica's pool) may far outnumber server connections.
max_client_conn = 2000
; The tests create a database each; idle automatic pools go after 30 s.
autodb_idle_timeout = 30
; sqlx sends extra_float_digits in its startup packet; pgbouncer 1.18 refuses startup
; parameters it does not know unless they are listed here.
ignore_startup_parameters = extra_float_digits
EOF
  if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"; fi
  log "starting pgbouncer on 127.0.0.1:$PGB_PORT ($PGB_POOL_MODE pooling, pool size $PGB_POOL_SIZE)"
  as_pg "$bin" -d -q "$dir/pgbouncer.ini" >"$STACK/logs/pgbouncer.log" 2>&1 ||
    { cat "$STACK/logs/pgbouncer.log" "$dir/pgbouncer.log" >&2 2>/dev/null; die "pgbouncer did not start"; }
  local i
  for ((i = 0; i < 50; i++)); do [ -s "$dir/pgbouncer.pid" ] && break; sleep 0.1; done
  cp "$dir/pgbouncer.pid" "$STACK/pids/pgbouncer.pid"
  wait_for pgbouncer 20 psql -h 127.0.0.1 -p "$PGB_PORT" -U postgres -d notify -c 'select 1'
  pgbouncer_env >"$dir/env"
  log "$("$bin" --version | head -n 1) ready; its settings in $dir/env"
}

stop_pid() { # name
  local f=$STACK/pids/$1.pid
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $1 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop_service() { # name
  case "$1" in
    rabbitmq)
      if alive "$STACK/pids/rabbitmq.pid"; then
        (rabbit_env; timeout 30 /usr/lib/rabbitmq/bin/rabbitmqctl -q -n "$RABBIT_NODE" stop >/dev/null 2>&1) || true
      fi ;;
    postgres)
      if alive "$STACK/pids/postgres.pid"; then
        as_pg "$(pg_bin)/pg_ctl" -D "$(pg_dir)/data" -m fast -w stop >/dev/null 2>&1 || true
      fi ;;
  esac
  stop_pid "$1"
}

print_env() {
  cat <<EOF
export NOTIFY_DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/notify
export NOTIFY_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres
export NOTIFY_AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f
export NOTIFY_SMTP_URL=smtp://127.0.0.1:$SMTP_PORT
export NOTIFY_MAILDEV_URL=http://127.0.0.1:$MAILDEV_WEB_PORT
export NOTIFY_SIM_URL=http://127.0.0.1:$SIM_PORT
export NOTIFY_LINE_API_BASE=http://127.0.0.1:$SIM_PORT
export NOTIFY_LINE_CHANNEL_TOKEN=$LINE_TOKEN
export NOTIFY_LINE_CHANNEL_SECRET=$LINE_SECRET
export NOTIFY_HTTP_ADDR=127.0.0.1:$HTTP_PORT
export NOTIFY_HTTP_URL=http://127.0.0.1:$HTTP_PORT
export NOTIFY_UNSUBSCRIBE_URL=http://127.0.0.1:$HTTP_PORT/unsubscribe
export NOTIFY_UNSUBSCRIBE_SECRET=local-unsubscribe-signing-secret
export NOTIFY_INBOX_JWT_SECRET=local-inbox-jwt-secret-of-at-least-32-characters
# ops / notify-local (argon2id, made with \`http-api hash-password\`); plain http here, so the
# console's session cookie goes without Secure (local development only).
export NOTIFY_CONSOLE_USERS='ops:\$argon2id\$v=19\$m=19456,t=2,p=1\$MLO1DajZXLmVnrYks5P/TQ\$X1Os3RK4CCu721SWZlrD3hLsT2yzwGx75bz+2uwUoZs'
export NOTIFY_CONSOLE_INSECURE_COOKIES=true
export NOTIFY_CONSOLE_SECRET=local-console-session-secret-of-32-characters
export NOTIFY_BROWSER_MODULES=$STACK/browser/node_modules
export NOTIFY_CHROMIUM=/usr/bin/chromium
export NOTIFY_EXAMPLES_PYTHON=$STACK/examples/venv/bin/python
export NOTIFY_EXAMPLES_DIR=$repo/examples
export NOTIFY_FCM_API_BASE=http://127.0.0.1:$SIM_PORT
export NOTIFY_FCM_SERVICE_ACCOUNT_FILE=$STACK/keys/fcm-service-account.json
export NOTIFY_FCM_PUBLIC_KEY_FILE=$STACK/keys/fcm-public.pem
export NOTIFY_APNS_API_BASE=http://127.0.0.1:$SIM_PORT
export NOTIFY_APNS_KEY_FILE=$STACK/keys/apns-key.p8
export NOTIFY_APNS_PUBLIC_KEY_FILE=$STACK/keys/apns-public.pem
export NOTIFY_APNS_KEY_ID=LOCALKEY01
export NOTIFY_APNS_TEAM_ID=LOCALTEAM1
export NOTIFY_APNS_TOPIC=test.notify.app
export NOTIFY_VAPID_PRIVATE_KEY_FILE=$STACK/keys/vapid-key.pem
export NOTIFY_VAPID_SUBJECT=mailto:ops@notify.example.test
export NOTIFY_WEBPUSH_BASE_OVERRIDE=http://127.0.0.1:$SIM_PORT/webpush
# The demo's browser subscriptions are on push.example.test (the simulator's push service,
# reached through the override above), besides the real browsers' push services.
export NOTIFY_WEB_PUSH_HOSTS=push.example.test,fcm.googleapis.com,updates.push.services.mozilla.com,web.push.apple.com,.notify.windows.com
EOF
}

# --- rabbitmq-cluster: three RabbitMQ nodes clustered on this machine ------------------
# Node i (1..3): AMQP on CLUSTER_PORT + 11*(i-1), Erlang distribution on that + 20000, its
# CLI tools on that + 30000..+30010 (so no range overlaps the next node's), the management
# plugin (HTTP API, for `leader` and `members`) on that + 5; name notifyc<port>@localhost.
# Data under $STACK/rabbitmq-cluster/node<i>/, stdout in $STACK/logs/rabbitmq-c<i>.log, the
# Erlang VM's (beam.smp) pid in $STACK/pids/rabbitmq-c<i>.pid. The three nodes and their
# CLI share one cookie and a private epmd on CLUSTER_EPMD_PORT, started and stopped with
# them (the machine's epmd on 4369 serves other nodes and is left alone).
C_DIR=$STACK/rabbitmq-cluster
C_NODES="1 2 3"

c_port() { echo $((CLUSTER_PORT + 11 * ($1 - 1))); }
c_mgmt() { echo $(($(c_port "$1") + 5)); }
c_name() { echo "notifyc$(c_port "$1")@localhost"; }
c_pidfile() { echo "$STACK/pids/rabbitmq-c$1.pid"; }
c_alive() { alive "$(c_pidfile "$1")"; }
c_port_open() { bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

cluster_env() { # i: the environment of node i's server and of the CLI tools aimed at it
  local d=$C_DIR/node$1 p; p=$(c_port "$1")
  export HOME=$d/home
  export RABBITMQ_NODENAME=notifyc$p@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$p
  export RABBITMQ_DIST_PORT=$((p + 20000))
  export RABBITMQ_MNESIA_BASE=$d/mnesia
  export RABBITMQ_LOG_BASE=$d/log
  export RABBITMQ_PID_FILE=$d/rabbit.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
  export RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config
  export RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf
  # Erlang distribution only on the loopback interface, through the cluster's own epmd.
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_EPMD_PORT=$CLUSTER_EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1
}

# The CLI (a second Erlang VM: seconds to start, longer on a loaded machine): only for
# debugging, e.g. `cluster_ctl 1 cluster_status`.
cluster_ctl() { # i args...
  local i=$1; shift
  (cluster_env "$i"; exec /usr/lib/rabbitmq/bin/rabbitmqctl -n "$(c_name "$i")" "$@")
}

cluster_files() { # i: config of node i (rewritten on every start), the shared cookie
  local i=$1 d=$C_DIR/node$1 j
  mkdir -p "$d/home" "$d/mnesia" "$d/log"
  if [ ! -s "$C_DIR/cookie" ]; then
    (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$C_DIR/cookie")
  fi
  if ! cmp -s "$C_DIR/cookie" "$d/home/.erlang.cookie"; then
    rm -f "$d/home/.erlang.cookie"
    cp "$C_DIR/cookie" "$d/home/.erlang.cookie"
    chmod 400 "$d/home/.erlang.cookie"
  fi
  {
    echo "# Generated by deploy/local-stack.sh rabbitmq-cluster (node $i of 3)."
    echo "loopback_users = none"
    # A blank node joins the first listed node that runs (`up` starts a blank cluster's
    # node 1 alone first: blank nodes started together would each boot standalone once
    # their discovery retries ran out). Only used on a node's first boot: afterwards it
    # rejoins the nodes it last ran with, waiting for them (up to 5 minutes).
    echo "cluster_formation.peer_discovery_backend = classic_config"
    for j in $C_NODES; do echo "cluster_formation.classic_config.nodes.$j = $(c_name "$j")"; done
    # A node that loses sight of both others stops serving (closes its AMQP port) until
    # it sees one again, instead of going on as a second cluster: with two nodes killed,
    # the third pauses until one of them is started again.
    echo "cluster_partition_handling = pause_minority"
    # Alarms block publishers on every node of the cluster. 0.3 of RAM per node (the
    # three together below the machine's RAM; the single node keeps the default 0.4);
    # the default free-disk limit (50 MB) made explicit: a relative one (a multiple of
    # RAM, production's advice) would block publishers on a dev box with a fuller disk.
    echo "vm_memory_high_watermark.relative = 0.3"
    echo "disk_free_limit.absolute = 50MB"
    echo "management.tcp.ip = 127.0.0.1"
    echo "management.tcp.port = $(c_mgmt "$i")"
  } >"$d/rabbitmq.conf"
  # Quorum queues: members on quorum_cluster_size nodes when declared without
  # x-quorum-initial-group-size (3.10 has no rabbitmq.conf key for it; its default is 3,
  # written out here): all three nodes.
  echo '[{rabbit, [{quorum_cluster_size, 3}]}].' >"$d/advanced.config"
  echo '[rabbitmq_management].' >"$d/enabled_plugins"
  : >"$d/rabbitmq-env.conf"
}

cluster_epmd_up() {
  local f=$STACK/pids/rabbitmq-c-epmd.pid
  alive "$f" && return
  if c_port_open "$CLUSTER_EPMD_PORT"; then
    die "port $CLUSTER_EPMD_PORT (NOTIFY_AMQP_CLUSTER_EPMD_PORT) is taken by something this script did not start"
  fi
  setsid /usr/bin/epmd -port "$CLUSTER_EPMD_PORT" -address 127.0.0.1 \
    >"$STACK/logs/rabbitmq-c-epmd.log" 2>&1 </dev/null &
  echo $! >"$f"
  wait_for rabbitmq-c-epmd 10 c_port_open "$CLUSTER_EPMD_PORT"
}

cluster_start_node() { # i: starts node i in the background; cluster_wait_node waits for it
  local i=$1 d=$C_DIR/node$1
  cluster_files "$i"
  rm -f "$d/rabbit.pid" "$(c_pidfile "$i")"
  c_port_open "$(c_port "$i")" && die "port $(c_port "$i") is taken by something this script did not start"
  log "starting rabbitmq cluster node $i ($(c_name "$i")) on 127.0.0.1:$(c_port "$i")"
  printf '\n--- %s: start\n' "$(date -Is)" >>"$STACK/logs/rabbitmq-c$i.log"
  (
    cluster_env "$i"
    exec setsid /usr/lib/rabbitmq/bin/rabbitmq-server >>"$STACK/logs/rabbitmq-c$i.log" 2>&1 </dev/null
  ) &
  # The server script waits for the Erlang VM it starts; the VM writes its own pid to
  # RABBITMQ_PID_FILE early in its boot (copied to $STACK/pids by cluster_wait_node).
  echo $! >"$d/wrapper.pid"
}

cluster_wait_node() { # i seconds: until node i's AMQP port accepts
  local i=$1 secs=$2 d=$C_DIR/node$1 n pid
  for ((n = 0; n < secs * 5; n++)); do
    if [ ! -s "$(c_pidfile "$i")" ] && [ -s "$d/rabbit.pid" ]; then
      pid=$(cat "$d/rabbit.pid")
      if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = beam.smp ]; then echo "$pid" >"$(c_pidfile "$i")"; fi
    fi
    if [ -s "$(c_pidfile "$i")" ] && c_port_open "$(c_port "$i")"; then return 0; fi
    if ! alive "$d/wrapper.pid" && ! c_alive "$i"; then
      tail -n 20 "$STACK/logs/rabbitmq-c$i.log" >&2 2>/dev/null || true
      die "rabbitmq cluster node $i exited during start (logs: $STACK/logs/rabbitmq-c$i.log, $d/log)"
    fi
    sleep 0.2
  done
  die "rabbitmq cluster node $i not ready after ${secs}s (logs: $STACK/logs/rabbitmq-c$i.log, $d/log)"
}

# GET on the management API of the first running node (or of node $2); prints the body.
cluster_api() { # path [node]
  local i
  for i in ${2:-$C_NODES}; do
    c_alive "$i" || continue
    curl -fsS --max-time 3 -u guest:guest "http://127.0.0.1:$(c_mgmt "$i")/api/$1" 2>/dev/null && return 0
  done
  return 1
}

# Node numbers of the node names on stdin (JSON) at key $1 of the object; a list or one.
cluster_numbers() { # key
  python3 -c '
import json, sys
key, base = sys.argv[1], int(sys.argv[2])
try:
    v = json.load(sys.stdin).get(key)
except ValueError:
    sys.exit(1)
names = v if isinstance(v, list) else [v] if v else []
out = []
for n in names:
    try:
        port = int(n.split("@")[0][len("notifyc"):])
    except ValueError:
        continue
    if (port - base) % 11 == 0 and 0 <= (port - base) // 11 < 3:
        out.append((port - base) // 11 + 1)
for n in sorted(out):
    print(n)
sys.exit(0 if out else 1)
' "$1" "$CLUSTER_PORT"
}

# Node numbers the cluster reports running, in node $1's view (any running node's if unset).
cluster_running() { # [i]
  cluster_api 'nodes?columns=name,running' "${1:-}" | python3 -c '
import json, sys
base = int(sys.argv[1])
for n in json.load(sys.stdin):
    if n.get("running"):
        port = int(n["name"].split("@")[0][len("notifyc"):])
        print((port - base) // 11 + 1)
' "$CLUSTER_PORT" | sort
}

cluster_wait_joined() { # i seconds: until another running node sees node i running
  local i=$1 secs=$2 n j others
  for ((n = 0; n < secs * 2; n++)); do
    others=0
    for j in $C_NODES; do
      if [ "$j" = "$i" ] || ! c_alive "$j"; then continue; fi
      others=1
      if cluster_running "$j" | grep -qx "$i"; then return 0; fi
    done
    # Alone: no other node to see it.
    [ "$others" = 1 ] || return 0
    sleep 0.5
  done
  die "rabbitmq cluster node $i runs but has not rejoined after ${secs}s (logs: $C_DIR/node$i/log)"
}

# Until node i's replica of every quorum queue with a member there runs again (the
# management API's `online`, refreshed every few seconds); a warning after $2 seconds.
cluster_wait_replicas() { # i seconds
  local i=$1 secs=$2 n missing
  for ((n = 0; n < secs * 2; n++)); do
    missing=$(cluster_api 'queues?columns=name,type,members,online' | python3 -c '
import json, sys
node = sys.argv[1]
try:
    qs = json.load(sys.stdin)
except ValueError:
    print("?"); sys.exit()
for q in qs:
    if q.get("type") == "quorum" and node in (q.get("members") or []) and node not in (q.get("online") or []):
        print(q["name"])
' "$(c_name "$i")") || missing="?"
    [ -z "$missing" ] && return 0
    sleep 0.5
  done
  log "warning: after ${secs}s node $i is not yet an online member of: $(echo "$missing" | tr '\n' ' ')"
}

cluster_up() {
  mkdir -p "$STACK/logs" "$STACK/pids" "$C_DIR"
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
  cluster_epmd_up
  local i seeded=() blank=() n
  for i in $C_NODES; do
    if c_alive "$i"; then continue; fi
    if [ -n "$(ls -A "$C_DIR/node$i/mnesia" 2>/dev/null)" ]; then seeded+=("$i"); else blank+=("$i"); fi
  done
  # A blank cluster: node 1 first, the others then join it.
  if [ ${#seeded[@]} -eq 0 ] && [ ${#blank[@]} -eq 3 ]; then
    cluster_start_node 1
    cluster_wait_node 1 360
    blank=(2 3)
  fi
  # Nodes with data together: each waits for the nodes it last ran with.
  for i in "${seeded[@]}"; do cluster_start_node "$i"; done
  for i in "${seeded[@]}"; do cluster_wait_node "$i" 360; done
  for i in "${blank[@]}"; do cluster_start_node "$i"; done
  for i in "${blank[@]}"; do cluster_wait_node "$i" 360; done
  for ((n = 0; n < 120; n++)); do
    [ "$(cluster_running | wc -l)" = 3 ] && break
    sleep 0.5
  done
  [ "$(cluster_running | wc -l)" = 3 ] ||
    die "the cluster does not report its 3 nodes running: $(cluster_running | tr '\n' ' ')(logs in $C_DIR/node*/log)"
  log "rabbitmq cluster ready: $(cluster_env_line)"
}

cluster_down() {
  local i pid n
  # SIGTERM: each node stops as `rabbitmqctl stop` would (without starting a CLI VM).
  for i in $C_NODES; do
    if c_alive "$i"; then
      pid=$(cat "$(c_pidfile "$i")")
      log "stopping rabbitmq cluster node $i (pid $pid)"
      kill "$pid" 2>/dev/null || true
    fi
  done
  for i in $C_NODES; do
    if c_alive "$i"; then
      pid=$(cat "$(c_pidfile "$i")")
      for ((n = 0; n < 600; n++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && { log "node $i still running after 60 s: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; }
    fi
    # The server script exits with its VM; it is stopped too if the VM never started.
    if alive "$C_DIR/node$i/wrapper.pid"; then
      pid=$(cat "$C_DIR/node$i/wrapper.pid")
      kill "$pid" 2>/dev/null || true
      for ((n = 0; n < 100; n++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$(c_pidfile "$i")" "$C_DIR/node$i/wrapper.pid"
  done
  stop_pid rabbitmq-c-epmd
}

cluster_kill() { # i
  local i=$1 pid n
  c_alive "$i" || die "rabbitmq cluster node $i is not running"
  pid=$(cat "$(c_pidfile "$i")")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = beam.smp ] || die "pid $pid of node $i is not beam.smp"
  log "SIGKILL rabbitmq cluster node $i (beam.smp pid $pid)"
  kill -9 "$pid"
  for ((n = 0; n < 300; n++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && die "pid $pid still there 30 s after SIGKILL"
  rm -f "$(c_pidfile "$i")"
}

cluster_start() { # i
  local i=$1
  mkdir -p "$STACK/logs" "$STACK/pids" "$C_DIR"
  cluster_epmd_up
  if c_alive "$i"; then log "rabbitmq cluster node $i already running"; else cluster_start_node "$i"; fi
  cluster_wait_node "$i" 360
  cluster_wait_joined "$i" 120
  cluster_wait_replicas "$i" 60
}

cluster_status() {
  local i
  for i in $C_NODES; do
    if c_alive "$i" && c_port_open "$(c_port "$i")"; then
      echo "rabbitmq-c$i: running (pid $(cat "$(c_pidfile "$i")"), port $(c_port "$i"), management $(c_mgmt "$i"), $(c_name "$i"))"
    elif c_alive "$i"; then
      # Booting, waiting for its peers, or paused (pause_minority: it sees neither other node).
      echo "rabbitmq-c$i: running, AMQP port closed (pid $(cat "$(c_pidfile "$i")"), port $(c_port "$i"), $(c_name "$i"))"
    else
      echo "rabbitmq-c$i: stopped (port $(c_port "$i"), $(c_name "$i"))"
    fi
  done
}

cluster_env_line() {
  local i urls=()
  for i in $C_NODES; do urls+=("amqp://guest:guest@127.0.0.1:$(c_port "$i")/%2f"); done
  (IFS=,; echo "export NOTIFY_AMQP_URL=${urls[*]}")
}

cluster_queue() { # key queue: node numbers of the queue's leader or members
  local q
  q=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$2")
  cluster_api "queues/%2f/$q" | cluster_numbers "$1"
}

# What earlier test and bench runs left behind (a test that fails or is killed never
# reaches its own cleanup), and only that: a test database no one is connected to, then
# the queues of tests whose database is gone (a test's database and queue prefix share its
# id) and of benches started over two hours ago, so a run still going keeps its own. Warns
# instead of failing: leftovers only cost CPU and disk.
SWEEP_DATABASES="(d.datname LIKE 'notify\\_t\\_%' OR d.datname LIKE 'notify\\_cost\\_%')
  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)"
# Erlang for `rabbitmqctl eval`; LIVE becomes the ids of the test databases still there.
SWEEP_QUEUES_ERL='Live = [LIVE], Now = erlang:system_time(second),
  Stale = fun(N) ->
    case re:run(N, "^t([0-9a-f]{12})[.]", [{capture, all_but_first, binary}]) of
      {match, [Id]} -> not lists:member(Id, Live);
      nomatch ->
        case re:run(N, "^bench-([0-9]{10})[.]", [{capture, all_but_first, binary}]) of
          {match, [T]} -> binary_to_integer(T) < Now - 7200;
          nomatch -> false
        end
    end
  end,
  Qs = [Q || Q <- rabbit_amqqueue:list(), Stale(element(4, amqqueue:get_name(Q)))],
  length([ok || Q <- Qs, element(1, catch rabbit_amqqueue:delete(Q, false, false, <<"sweep">>)) =:= ok]).'
sweep() {
  local q=0 dbs='' dropped=0 d live
  if alive "$STACK/pids/postgres.pid"; then
    dbs=$(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
      "SELECT d.datname FROM pg_database d WHERE $SWEEP_DATABASES") || { log "sweep: could not list databases"; dbs=''; }
    for d in $dbs; do
      # No FORCE: a database someone connected to meanwhile stays.
      if psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc "DROP DATABASE IF EXISTS \"$d\"" 2>>"$STACK/logs/sweep.log"; then
        dropped=$((dropped + 1))
      else
        log "sweep: database $d is in use; left"
      fi
    done
  fi
  if alive "$STACK/pids/rabbitmq.pid"; then
    live=$(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
      "SELECT string_agg('<<\"' || substr(datname, 10) || '\">>', ',') FROM pg_database WHERE datname LIKE 'notify\\_t\\_%'") ||
      { log "sweep: could not list test databases; queues left"; return 0; }
    # One `rabbitmqctl eval` (a second Erlang VM, seconds to start) deletes them all.
    q=$(rabbit_env; timeout 300 /usr/lib/rabbitmq/bin/rabbitmqctl -q -n "$RABBIT_NODE" eval \
      "${SWEEP_QUEUES_ERL/LIVE/$live}" 2>>"$STACK/logs/sweep.log") ||
      { log "sweep: rabbitmqctl failed ($STACK/logs/sweep.log); queues left"; q='?'; }
  fi
  log "swept $q queues and $dropped databases left by earlier test and bench runs"
}

cmd=${1:-}
case "$cmd" in
  up)
    mkdir -p "$STACK/logs" "$STACK/pids"
    install_missing
    install_examples
    make_fcm_key
    make_apns_key
    make_vapid_key
    start_postgres
    start_rabbitmq
    start_maildev
    start_sim
    print_env >"$STACK/env"
    log "ready; environment in $STACK/env"
    ;;
  down)
    # http-api is started by the demo and left running for its console and inbox links.
    stop_pid http-api
    stop_pid pgbouncer
    cluster_down
    for s in provider-sim maildev rabbitmq postgres; do stop_service "$s"; done
    ;;
  stop)
    # Stops one service (e.g. to test recovery); `up` starts it again.
    case "${2:-}" in
      postgres | rabbitmq | maildev | provider-sim) stop_service "$2" ;;
      *) echo "usage: $0 stop postgres|rabbitmq|maildev|provider-sim" >&2; exit 64 ;;
    esac
    ;;
  status)
    for s in postgres rabbitmq maildev provider-sim; do
      if alive "$STACK/pids/$s.pid"; then echo "$s: running (pid $(cat "$STACK/pids/$s.pid"))"; else echo "$s: stopped"; fi
    done
    ;;
  env) print_env ;;
  sweep) mkdir -p "$STACK/logs"; sweep ;;
  pgbouncer)
    mkdir -p "$STACK/logs" "$STACK/pids"
    case "${2:-}" in
      up) start_pgbouncer ;;
      down) stop_pid pgbouncer ;;
      status) if alive "$STACK/pids/pgbouncer.pid"; then echo "pgbouncer: running (pid $(cat "$STACK/pids/pgbouncer.pid"), port $PGB_PORT)"; else echo "pgbouncer: stopped"; fi ;;
      env) pgbouncer_env ;;
      *) echo "usage: $0 pgbouncer up|down|status|env" >&2; exit 64 ;;
    esac
    ;;
  rabbitmq-cluster)
    case "${2:-}" in
      up) cluster_up ;;
      down) mkdir -p "$STACK/pids"; cluster_down ;;
      status) cluster_status ;;
      env) cluster_env_line ;;
      leader | members)
        [ -n "${3:-}" ] || { echo "usage: $0 rabbitmq-cluster $2 QUEUE" >&2; exit 64; }
        if [ "$2" = leader ]; then key=leader; else key=members; fi
        cluster_queue "$key" "$3" || { echo "$2 of queue $3 unknown (no running node answered, or no such queue)" >&2; exit 1; }
        ;;
      kill | start)
        case "${3:-}" in 1 | 2 | 3) ;; *) echo "usage: $0 rabbitmq-cluster $2 1|2|3" >&2; exit 64 ;; esac
        if [ "$2" = kill ]; then cluster_kill "$3"; else cluster_start "$3"; fi
        ;;
      *) echo "usage: $0 rabbitmq-cluster up|down|status|env|leader QUEUE|members QUEUE|kill N|start N" >&2; exit 64 ;;
    esac
    ;;
  examples) install_examples ;;
  install)
    shift
    [ $# -gt 0 ] || { echo "usage: $0 install PKG..." >&2; exit 64; }
    mkdir -p "$STACK/logs"
    apt_install "$@"
    ;;
  *) echo "usage: $0 up|down|stop SERVICE|status|env|sweep|examples|install PKG...|pgbouncer up|down|status|env|rabbitmq-cluster VERB" >&2; exit 64 ;;
esac
