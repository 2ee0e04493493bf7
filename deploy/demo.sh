#!/usr/bin/env bash
# `make demo`: start the local stack, build, migrate a fresh demo database, start ingest,
# the four channel workers and worker-webhook, run `notifyctl demo`, stop the services again (the stack keeps running
# so MailDev's web UI can be opened; `make down` stops it).
set -euo pipefail

# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
echo "== building (first build takes a few minutes), starting the stack, migrating notify_demo"
# A fresh database per demo run, so the demo's counts are exact.
prepare debug notify_demo "${NOTIFY_DEMO_GRPC_PORT:-50151}"
export NOTIFY_AMQP_PREFIX=demo.
export NOTIFY_EMAIL_FROM='ฝ่ายบริการลูกค้า ร้านตัวอย่าง <noreply@example.test>'
export NOTIFY_WORKER_CONCURRENCY=8
# The demo's status-webhook receiver (examples/python) listens on 127.0.0.1 over plain http.
export NOTIFY_DEV_HTTP_HOSTS=127.0.0.1

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# Each service's admin endpoint (/healthz, /readyz, /metrics) on its own port.
admin_base=${NOTIFY_DEMO_ADMIN_PORT:-59464}
declare -A admin_port=([ingest]=$admin_base [worker-inapp]=$((admin_base + 1))
  [worker-email]=$((admin_base + 2)) [worker-line]=$((admin_base + 3)) [worker-push]=$((admin_base + 4))
  [worker-webhook]=$((admin_base + 5)))
start() { # name args...
  local name=$1; shift
  NOTIFY_ADMIN_ADDR=127.0.0.1:${admin_port[$name]} \
    "$NOTIFY_BIN_DIR/$name" "$@" >"$STACK/logs/demo-$name.log" 2>&1 &
  pids+=($!)
}
echo "== starting ingest and workers (logs: $STACK/logs/demo-*.log, JSON lines)"
start ingest serve
# http-api stays up after the demo (like the stack) so its console and example inbox can be
# opened; `make down` stops it.
if [ -f "$STACK/pids/http-api.pid" ]; then
  kill "$(cat "$STACK/pids/http-api.pid")" 2>/dev/null || true
  rm -f "$STACK/pids/http-api.pid"
fi
setsid "$NOTIFY_BIN_DIR/http-api" >"$STACK/logs/demo-http-api.log" 2>&1 </dev/null &
echo $! >"$STACK/pids/http-api.pid"
for w in worker-inapp worker-email worker-line worker-push worker-webhook; do start "$w"; done

for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/${NOTIFY_GRPC_ADDR/://}") 2>/dev/null && break
  sleep 0.1
done

"$NOTIFY_BIN_DIR/notifyctl" demo

echo
echo "== metrics: deliveries sent per channel and provider, from each worker's /metrics"
for w in worker-inapp worker-email worker-line worker-push worker-webhook; do
  url=http://127.0.0.1:${admin_port[$w]}
  printf '%-14s readyz %s  ' "$w" "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")"
  curl -s "$url/metrics" | grep -E '^notify_(deliveries_sent|webhook_attempts)_total' | tr '\n' ' ' || true
  echo
done
