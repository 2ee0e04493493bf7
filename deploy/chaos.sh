#!/usr/bin/env bash
# `make chaos`: broadcasts to 2,000 and then 20,000 recipients while workers, ingest,
# RabbitMQ and PostgreSQL are killed and restarted, then checks every provider record
# against Postgres (see crates/notifyctl/src/chaos.rs). Prints one `chaos:` line per run
# and exits non-zero if any promise was broken.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
target=${CARGO_TARGET_DIR:-$repo/target}/debug
GRPC_PORT=${NOTIFY_CHAOS_GRPC_PORT:-50161}

cargo build --workspace --bins
PROVIDER_SIM_BIN=$target/provider-sim "$here/local-stack.sh" up
# shellcheck disable=SC1091
source "$STACK/env"

PGOPTIONS='-c client_min_messages=warning' psql "$NOTIFY_TEST_DATABASE_URL" -qc 'DROP DATABASE IF EXISTS notify_chaos WITH (FORCE)' >/dev/null
psql "$NOTIFY_TEST_DATABASE_URL" -qc 'CREATE DATABASE notify_chaos' >/dev/null
export NOTIFY_DATABASE_URL=${NOTIFY_DATABASE_URL%/*}/notify_chaos
export NOTIFY_AMQP_PREFIX=chaos.
export NOTIFY_GRPC_ADDR=127.0.0.1:$GRPC_PORT
export NOTIFY_GRPC_URL=http://127.0.0.1:$GRPC_PORT
export NOTIFY_EMAIL_FROM='ทดสอบระบบ <chaos@example.test>'
# Production defaults for leases (60 s) and the sweeper (10 s); short retry delays so the
# 5 % of 503 answers do not stretch the run.
export NOTIFY_RETRY_DELAYS=${NOTIFY_RETRY_DELAYS:-1s,2s,5s,10s}
export NOTIFY_WORKER_CONCURRENCY=${NOTIFY_WORKER_CONCURRENCY:-32}
export NOTIFY_BIN_DIR=$target
export NOTIFY_STACK_SCRIPT=$here/local-stack.sh
export NOTIFY_LOG_DIR=$STACK/logs
export PROVIDER_SIM_BIN=$target/provider-sim
"$target/ingest" migrate 2>/dev/null
echo "chaos: lease ${NOTIFY_LEASE:-60s}, sweep ${NOTIFY_SWEEP_INTERVAL:-10s}, retries $NOTIFY_RETRY_DELAYS, worker concurrency $NOTIFY_WORKER_CONCURRENCY; logs in $STACK/logs/chaos-*.log"
"$target/notifyctl" chaos
