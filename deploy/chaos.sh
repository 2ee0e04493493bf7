#!/usr/bin/env bash
# `make chaos`: broadcasts to 2,000 and then 20,000 recipients while workers, ingest,
# RabbitMQ and PostgreSQL are killed and restarted, then checks every provider record
# against Postgres, and every status webhook against the Python and Node receivers of
# examples/ (see crates/notifyctl/src/chaos/). Prints one `chaos:` line per run
# and exits non-zero if any promise was broken.
set -euo pipefail

# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
prepare debug notify_chaos "${NOTIFY_CHAOS_GRPC_PORT:-50161}"
export NOTIFY_AMQP_PREFIX=chaos.
export NOTIFY_EMAIL_FROM='ทดสอบระบบ <chaos@example.test>'
# Production defaults for leases (60 s) and the sweeper (10 s); short retry delays so the
# 5 % of 503 answers do not stretch the run.
export NOTIFY_RETRY_DELAYS=${NOTIFY_RETRY_DELAYS:-1s,2s,5s,10s}
export NOTIFY_WORKER_CONCURRENCY=${NOTIFY_WORKER_CONCURRENCY:-32}
# The status-webhook receivers of examples/ listen on 127.0.0.1 over plain http; a
# message whose POST failed (worker killed, broker down) is retried after seconds.
export NOTIFY_DEV_HTTP_HOSTS=127.0.0.1
export NOTIFY_WEBHOOK_RETRY_DELAYS=${NOTIFY_WEBHOOK_RETRY_DELAYS:-1s,2s,5s,10s}
export NOTIFY_STACK_SCRIPT=$here/local-stack.sh
echo "chaos: lease ${NOTIFY_LEASE:-60s}, sweep ${NOTIFY_SWEEP_INTERVAL:-10s}, retries $NOTIFY_RETRY_DELAYS, worker concurrency $NOTIFY_WORKER_CONCURRENCY; logs in $STACK/logs/chaos-*.log"
"$NOTIFY_BIN_DIR/notifyctl" chaos
