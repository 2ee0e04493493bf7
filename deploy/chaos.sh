#!/usr/bin/env bash
# `make chaos`: broadcasts to 2,000 and then 20,000 recipients while workers, ingest,
# RabbitMQ and PostgreSQL are killed and restarted, then checks every provider record
# against Postgres, and every status webhook against the Python and Node receivers of
# examples/ (see crates/notifyctl/src/chaos/). Prints one `chaos:` line per run
# and exits non-zero if any promise was broken.
#
# `make chaos-ha` (`deploy/chaos.sh ha`): the same runs on a three-node RabbitMQ cluster
# (`local-stack.sh rabbitmq-cluster`) and a PostgreSQL primary with a synchronous standby
# behind HAProxy (`deploy/pg-ha.sh`), killing the node that leads the LINE queue and
# failing Postgres over instead of restarting them, after a failover check without and
# with synchronous replication (crates/notifyctl/src/chaos/ha.rs). Both are stopped at the
# end (NOTIFY_CHAOS_HA_KEEP=1 keeps them running).
set -euo pipefail

# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mode=${1:-single}
case "$mode" in
  single) prepare debug notify_chaos "${NOTIFY_CHAOS_GRPC_PORT:-50161}" ;;
  ha)
    prepare_stack debug "${NOTIFY_CHAOS_GRPC_PORT:-50161}"
    if [ "${NOTIFY_CHAOS_HA_KEEP:-0}" != 1 ]; then
      trap '"$here/local-stack.sh" rabbitmq-cluster down || true; "$here/pg-ha.sh" down || true' EXIT
    fi
    "$here/local-stack.sh" rabbitmq-cluster up
    eval "$("$here/local-stack.sh" rabbitmq-cluster env)"
    NOTIFY_PG_HA_SYNC=1 "$here/pg-ha.sh" up
    eval "$("$here/pg-ha.sh" env)"
    prepare_database notify_chaos
    export NOTIFY_CHAOS_HA=true NOTIFY_PG_HA_SCRIPT=$here/pg-ha.sh
    # Recovery goal 60 s: a worker killed with the production lease (60 s) recovers after
    # about 70 s (lease + one sweep), so this run leases for 30 s (docs/guarantees.md).
    export NOTIFY_LEASE=${NOTIFY_LEASE:-30s}
    ;;
  *) echo "usage: $0 [single|ha]" >&2; exit 64 ;;
esac
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
echo "chaos ($mode): lease ${NOTIFY_LEASE:-60s}, sweep ${NOTIFY_SWEEP_INTERVAL:-10s}, retries $NOTIFY_RETRY_DELAYS, worker concurrency $NOTIFY_WORKER_CONCURRENCY; logs in $STACK/logs/chaos-*.log"
"$NOTIFY_BIN_DIR/notifyctl" chaos
