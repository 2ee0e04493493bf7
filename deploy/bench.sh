#!/usr/bin/env bash
# `make bench`: release build, then `notifyctl bench` against the local stack (see
# crates/notifyctl/src/bench.rs for what is measured). Phase length: NOTIFY_BENCH_PHASE (30s).
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
"$NOTIFY_BIN_DIR/notifyctl" bench
