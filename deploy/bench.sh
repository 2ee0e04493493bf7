#!/usr/bin/env bash
# `make bench`: release build, then `notifyctl bench` against the local stack (see
# crates/notifyctl/src/bench/mod.rs for what is measured). Phase length: NOTIFY_BENCH_PHASE (30s).
# Then the Celery peer (bench/celery/run.sh: the do-it-yourself baseline on the same
# RabbitMQ, Postgres and simulator, after our phases so that nothing shares the cores with
# it) and our ratio to it (bench/celery/ratio.sh). NOTIFY_BENCH_PEER=0 leaves the peer out.
set -euo pipefail

# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
prepare release notify_bench "${NOTIFY_BENCH_GRPC_PORT:-50171}"
export NOTIFY_AMQP_PREFIX=bench-$(date +%s).
export NOTIFY_EMAIL_FROM='bench <bench@example.test>'
export NOTIFY_WORKER_CONCURRENCY=${NOTIFY_WORKER_CONCURRENCY:-64}
export RUST_LOG=${RUST_LOG:-warn}
# The bench's own http-api (the demo's may be running on NOTIFY_HTTP_PORT).
export NOTIFY_HTTP_ADDR=127.0.0.1:${NOTIFY_BENCH_HTTP_PORT:-58191}
export NOTIFY_HTTP_URL=http://$NOTIFY_HTTP_ADDR
ours=$(mktemp) peer=$(mktemp)
trap 'rm -f "$ours" "$peer"' EXIT
"$NOTIFY_BIN_DIR/notifyctl" bench | tee "$ours"
if [[ ${NOTIFY_BENCH_PEER:-1} != 0 ]]; then
  if ! NOTIFY_PEER_DATABASE=notify_bench_peer NOTIFY_PEER_PREFIX=${NOTIFY_AMQP_PREFIX}peer. \
    "$repo/bench/celery/run.sh" | tee "$peer"; then
    echo "ratio to the peer: n/a (the peer failed; see above)"
    exit 1
  fi
  "$repo/bench/celery/ratio.sh" "$ours" "$peer"
fi
