# Shared by demo.sh, chaos.sh and bench.sh (sourced, not run).
#
#   prepare PROFILE DBNAME GRPC_PORT   (= prepare_stack PROFILE GRPC_PORT; prepare_database DBNAME)
#
# builds the binaries (PROFILE debug or release), starts the local stack, recreates the
# database DBNAME, migrates it, and exports what the services and notifyctl need:
# NOTIFY_DATABASE_URL, NOTIFY_GRPC_ADDR, NOTIFY_GRPC_URL, NOTIFY_API_KEY (a key allowed
# everything, created in DBNAME), NOTIFY_BIN_DIR, NOTIFY_LOG_DIR,
# NOTIFY_STACK_DIR and
# everything in .stack/env.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}

prepare() {
  prepare_stack "$1" "$3"
  prepare_database "$2"
}

# prepare_stack PROFILE GRPC_PORT: builds, starts the local stack, exports all but the
# database's settings.
prepare_stack() {
  local profile=$1 port=$2
  local flags=()
  [ "$profile" = release ] && flags=(--release)
  (cd "$repo" && cargo build "${flags[@]}" --workspace --bins)
  target=${CARGO_TARGET_DIR:-$repo/target}/$profile
  PROVIDER_SIM_BIN=$target/provider-sim "$here/local-stack.sh" up
  # shellcheck disable=SC1091
  source "$STACK/env"
  export NOTIFY_GRPC_ADDR=127.0.0.1:$port
  export NOTIFY_GRPC_URL=http://127.0.0.1:$port
  export NOTIFY_BIN_DIR=$target
  export NOTIFY_LOG_DIR=$STACK/logs
  export NOTIFY_STACK_DIR=$STACK
  export PROVIDER_SIM_BIN=$target/provider-sim
}

# prepare_database DBNAME: recreates DBNAME on the server of NOTIFY_TEST_DATABASE_URL,
# migrates it, points NOTIFY_DATABASE_URL at it and creates NOTIFY_API_KEY in it.
prepare_database() {
  local db=$1
  PGOPTIONS='-c client_min_messages=warning' psql "$NOTIFY_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  psql "$NOTIFY_TEST_DATABASE_URL" -qc "CREATE DATABASE $db" >/dev/null
  export NOTIFY_DATABASE_URL=${NOTIFY_DATABASE_URL%/*}/$db
  "$NOTIFY_BIN_DIR/ingest" migrate 2>/dev/null
  # An API key for this run's callers (notifyctl sends NOTIFY_API_KEY with every call);
  # ingest requires one (NOTIFY_GRPC_AUTH=api_key by default).
  NOTIFY_API_KEY=$("$NOTIFY_BIN_DIR/notifyctl" keys create local-dev --types '*' --manage \
    --rate 1000000 --max-recipients 1000)
  export NOTIFY_API_KEY
}
