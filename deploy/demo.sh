#!/usr/bin/env bash
# `make demo`: start the local stack, build, migrate a fresh demo database, start ingest and
# the four workers, run `notifyctl demo`, stop the services again (the stack keeps running
# so MailDev's web UI can be opened; `make down` stops it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
target=${CARGO_TARGET_DIR:-$repo/target}/debug
GRPC_PORT=${NOTIFY_DEMO_GRPC_PORT:-50151}

echo "== building (first build takes a few minutes)"
cargo build --workspace --bins

PROVIDER_SIM_BIN=$target/provider-sim "$here/local-stack.sh" up
# shellcheck disable=SC1091
source "$STACK/env"

# A fresh database per demo run, so the demo's counts are exact.
admin=${NOTIFY_TEST_DATABASE_URL}
PGOPTIONS='-c client_min_messages=warning' psql "$admin" -qc 'DROP DATABASE IF EXISTS notify_demo WITH (FORCE)' >/dev/null
psql "$admin" -qc 'CREATE DATABASE notify_demo' >/dev/null
export NOTIFY_DATABASE_URL=${NOTIFY_DATABASE_URL%/*}/notify_demo
export NOTIFY_AMQP_PREFIX=demo.
export NOTIFY_GRPC_ADDR=127.0.0.1:$GRPC_PORT
export NOTIFY_GRPC_URL=http://127.0.0.1:$GRPC_PORT
export NOTIFY_EMAIL_FROM='ฝ่ายบริการลูกค้า ร้านตัวอย่าง <noreply@example.test>'
export NOTIFY_WORKER_CONCURRENCY=8

echo "== migrating $NOTIFY_DATABASE_URL"
"$target/ingest" migrate

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

start() { # name args...
  local name=$1; shift
  "$target/$name" "$@" >"$STACK/logs/demo-$name.log" 2>&1 &
  pids+=($!)
}
echo "== starting ingest and workers (logs: $STACK/logs/demo-*.log)"
start ingest serve
for w in worker-inapp worker-email worker-line worker-push; do start "$w"; done

for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$GRPC_PORT") 2>/dev/null && break
  sleep 0.1
done

"$target/notifyctl" demo
