#!/usr/bin/env bash
# `make bench`: release build, then `notifyctl bench` against the local stack (see
# crates/notifyctl/src/bench/mod.rs for what is measured). Phase length: NOTIFY_BENCH_PHASE (30s).
# Then the Celery peer (bench/celery/run.sh: the do-it-yourself baseline on the same
# RabbitMQ, Postgres and simulator, after our phases so that nothing shares the cores with
# it) and our ratio to it (bench/celery/ratio.sh). NOTIFY_BENCH_PEER=0 leaves the peer out.
#
# NOTIFY_BENCH_PGBOUNCER=1 runs the same phases through pgbouncer (docs/pooling.md):
# `deploy/local-stack.sh pgbouncer up` (pool mode NOTIFY_PGBOUNCER_POOL_MODE, session by
# default), then ingest, the workers, http-api and notifyctl's own queries go through it
# (NOTIFY_DATABASE_POOLER=pgbouncer); migrations and the API key are made directly, and
# the LISTEN connections and the retention pass use NOTIFY_DATABASE_DIRECT_URL. Every
# line it prints starts with "via pgbouncer (<mode>): " so it can sit beside a direct
# run's; the peer is left out (it does not go through the pooler) unless
# NOTIFY_BENCH_PEER=1. NOTIFY_BENCH_PROFILE=debug uses debug binaries: only to check
# the path (say NOTIFY_BENCH_PHASE=2s NOTIFY_BENCH_ONLY=ingest); debug figures mean nothing.
set -euo pipefail

# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
profile=${NOTIFY_BENCH_PROFILE:-release}
case "$profile" in
  release | debug) ;;
  *) echo "NOTIFY_BENCH_PROFILE=$profile: use release or debug" >&2; exit 64 ;;
esac
case "${NOTIFY_BENCH_PGBOUNCER:-0}" in
  0 | 1) ;;
  *) echo "NOTIFY_BENCH_PGBOUNCER=$NOTIFY_BENCH_PGBOUNCER: use 1 (through pgbouncer) or 0" >&2; exit 64 ;;
esac
prepare "$profile" notify_bench "${NOTIFY_BENCH_GRPC_PORT:-50171}"
# Earlier test and bench runs' queues and databases would take CPU from the measurements.
"$here/local-stack.sh" sweep
NOTIFY_AMQP_PREFIX=bench-$(date +%s).
export NOTIFY_AMQP_PREFIX
export NOTIFY_EMAIL_FROM='bench <bench@example.test>'
export NOTIFY_WORKER_CONCURRENCY=${NOTIFY_WORKER_CONCURRENCY:-64}
# One replica per worker, so worker-line may use LINE's whole per-channel budget: 2,000
# push requests a second (LINE Messaging API reference, rate limits; docs/operations.md:
# `line=` times worker-line's replicas stays within it). The workers' default, 1,000, keeps
# half for a second replica; with it, LINE's share of the end-to-end burst (half its
# deliveries) was held to 1,000 a second and the phase to about 2,400 deliveries a second
# while the cores still had room (docs/scaling.md, 2026-12-05).
export NOTIFY_RATE_LIMITS=${NOTIFY_RATE_LIMITS:-line=2000,fcm=5000}
export RUST_LOG=${RUST_LOG:-warn}
# The bench's own http-api (the demo's may be running on NOTIFY_HTTP_PORT).
export NOTIFY_HTTP_ADDR=127.0.0.1:${NOTIFY_BENCH_HTTP_PORT:-58191}
export NOTIFY_HTTP_URL=http://$NOTIFY_HTTP_ADDR
prefix='' peer_default=1
if [[ ${NOTIFY_BENCH_PGBOUNCER:-0} == 1 ]]; then
  "$here/local-stack.sh" pgbouncer up
  # shellcheck disable=SC1091
  source "$STACK/pgbouncer/env"
  mode=$(awk '$1 == "pool_mode" {print $3}' "$STACK/pgbouncer/pgbouncer.ini")
  export NOTIFY_DATABASE_URL=$NOTIFY_PGBOUNCER_URL/notify_bench
  # LISTEN and the retention's session lock go to Postgres itself (docs/pooling.md).
  export NOTIFY_DATABASE_DIRECT_URL=${NOTIFY_DATABASE_DIRECT_URL%/*}/notify_bench
  echo "via pgbouncer ($mode): $(/usr/sbin/pgbouncer --version | head -n 1), $NOTIFY_DATABASE_URL"
  prefix="via pgbouncer ($mode): "
  peer_default=0
fi
echo "${prefix}bench: provider rate limits per worker process: $NOTIFY_RATE_LIMITS"
ours=$(mktemp) peer=$(mktemp)
trap 'rm -f "$ours" "$peer"' EXIT
"$NOTIFY_BIN_DIR/notifyctl" bench | while IFS= read -r line; do printf '%s%s\n' "$prefix" "$line"; done | tee "$ours"
if [[ ${NOTIFY_BENCH_PEER:-$peer_default} != 0 ]]; then
  if ! NOTIFY_PEER_DATABASE=notify_bench_peer NOTIFY_PEER_PREFIX=${NOTIFY_AMQP_PREFIX}peer. \
    "$repo/bench/celery/run.sh" | tee "$peer"; then
    echo "ratio to the peer: n/a (the peer failed; see above)"
    exit 1
  fi
  "$repo/bench/celery/ratio.sh" "$ours" "$peer"
fi
