#!/usr/bin/env bash
# The Celery peer of `make bench` (bench/celery/run.py says what it measures). Creates or
# refreshes a project-local virtual environment with the pinned requirements.txt, then
# runs the peer once; its last line is
#   peer (celery, 4 prefork, acks_late): ingest E events/s (D deliveries/s), end to end X deliveries/s, N deliveries, 0 lost
# and it exits non-zero when a delivery was lost or a phase failed.
#
# Needs NOTIFY_DATABASE_URL, NOTIFY_AMQP_URL, NOTIFY_SIM_URL, NOTIFY_LINE_CHANNEL_TOKEN
# (`source .stack/env` gives them). The virtual environment is NOTIFY_PEER_VENV, by default
# ${NOTIFY_STACK_DIR:-<repo>/.stack}/bench-venv.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${NOTIFY_PEER_VENV:-${NOTIFY_STACK_DIR:-$repo/.stack}/bench-venv}
req=$here/requirements.txt
want=$(sha256sum "$req" | cut -d' ' -f1)

log() { printf 'peer: %s\n' "$*" >&2; }
die() { printf 'peer: %s\n' "$*" >&2; exit 1; }
# shellcheck source=deploy/host.sh
source "$repo/deploy/host.sh"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]]; then
  log "installing celery, psycopg and requests (pinned: bench/celery/requirements.txt) into $venv"
  make_venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  echo "$want" >"$venv/.stamp"
fi
exec 9>&-

exec "$venv/bin/python" "$here/run.py"
