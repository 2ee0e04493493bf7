#!/usr/bin/env bash
# `make bench`: release build, then `notifyctl bench` against the local stack (see
# crates/notifyctl/src/bench.rs for what is measured). Phase length: NOTIFY_BENCH_PHASE (30s).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
target=${CARGO_TARGET_DIR:-$repo/target}/release
GRPC_PORT=${NOTIFY_BENCH_GRPC_PORT:-50171}

cargo build --release --workspace --bins
PROVIDER_SIM_BIN=$target/provider-sim "$here/local-stack.sh" up
# shellcheck disable=SC1091
source "$STACK/env"
PGOPTIONS='-c client_min_messages=warning' psql "$NOTIFY_TEST_DATABASE_URL" -qc 'DROP DATABASE IF EXISTS notify_bench WITH (FORCE)' >/dev/null
psql "$NOTIFY_TEST_DATABASE_URL" -qc 'CREATE DATABASE notify_bench' >/dev/null
export NOTIFY_DATABASE_URL=${NOTIFY_DATABASE_URL%/*}/notify_bench
export NOTIFY_AMQP_PREFIX=bench-$(date +%s).
export NOTIFY_GRPC_ADDR=127.0.0.1:$GRPC_PORT
export NOTIFY_GRPC_URL=http://127.0.0.1:$GRPC_PORT
export NOTIFY_EMAIL_FROM='bench <bench@example.test>'
export NOTIFY_WORKER_CONCURRENCY=${NOTIFY_WORKER_CONCURRENCY:-64}
export NOTIFY_BIN_DIR=$target
export NOTIFY_LOG_DIR=$STACK/logs
export RUST_LOG=${RUST_LOG:-warn}
"$target/ingest" migrate
"$target/notifyctl" bench
