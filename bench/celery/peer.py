"""The do-it-yourself peer of `make bench`: what a team would build with Celery.

One Celery task per delivery, consumed from RabbitMQ by a prefork pool (4 processes,
`acks_late=True`, `worker_prefetch_multiplier=1`, the setting the Celery docs pair with
late acks so that a process holds one unacknowledged task at a time). Each task, with one
Postgres connection (psycopg 3) and one HTTP session (requests) per worker process:

1. claims the row: `UPDATE deliveries SET status='sending', attempts=attempts+1 ...
   WHERE id=%s AND status='pending' RETURNING ...`, commit;
2. POSTs a LINE push to the provider simulator, the endpoint our worker-line calls
   (`POST {NOTIFY_SIM_URL}/v2/bot/message/push`, `Authorization: Bearer <channel token>`,
   an `X-Line-Retry-Key` UUID kept on the row: the simulator answers 401 without the
   token and 409 to a key it already accepted; developers.line.biz/en/reference/
   messaging-api/#send-push-message, crates/provider-sim/src/line.rs);
3. marks it `sent` (commit), or puts it back to `pending` and retries the task in 1 s
   when the provider answered 429, 5xx or not at all (a 4xx other than 409 is `failed`).

As the claim is written (`pending` only), a row left `sending` by a process killed
between claim and mark is not claimed again when RabbitMQ redelivers its task: the peer
has no lease or sweeper, as the simple design has none; the bench kills nothing, so this
does not show in its figures.

Configuration (environment): PEER_BROKER_URL, PEER_PREFIX (queue and exchange names, so
the peer never touches the platform's queues), PEER_DB_URL, NOTIFY_SIM_URL,
NOTIFY_LINE_CHANNEL_TOKEN. `run.py` sets them and starts the worker with
`celery -A peer worker --pool=prefork --concurrency=4`.
"""

import os

import psycopg
import requests
from celery import Celery
from celery.signals import worker_process_init

PREFIX = os.environ.get("PEER_PREFIX", "peer-celery.")
QUEUE = f"{PREFIX}deliver"
SIM_URL = os.environ.get("NOTIFY_SIM_URL", "http://127.0.0.1:58080").rstrip("/")
LINE_TOKEN = os.environ.get("NOTIFY_LINE_CHANNEL_TOKEN", "local-line-channel-access-token")

app = Celery("peer", broker=os.environ.get("PEER_BROKER_URL", "amqp://guest:guest@127.0.0.1:5692//"))
app.conf.update(
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    # The reliability settings a team picks for "never lose a delivery": ack after the
    # task ran, requeue a task whose process died, one unacknowledged task per process,
    # and publisher confirms so that apply_async returns only once RabbitMQ has the task.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},
    task_ignore_result=True,
    # No remote control, events or gossip: nothing but the peer's own queue and exchange
    # is declared on the shared broker (these names are prefixed too, in case).
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    control_exchange=f"{PREFIX}celery",
    event_exchange=f"{PREFIX}celeryev",
    broker_connection_retry_on_startup=True,
)

_db = None
_http = None

CLAIM = """UPDATE deliveries SET status = 'sending', attempts = attempts + 1, updated_at = clock_timestamp()
           WHERE id = %s AND status = 'pending' RETURNING recipient, body, retry_key"""
SENT = """UPDATE deliveries SET status = 'sent', updated_at = clock_timestamp()
          WHERE id = %s AND status = 'sending'"""
BACK = """UPDATE deliveries SET status = %s, updated_at = clock_timestamp()
          WHERE id = %s AND status = 'sending'"""


@worker_process_init.connect
def _open(**_):
    """One Postgres connection and one HTTP session per prefork process."""
    _conn()
    _session()


def _conn():
    global _db
    if _db is None or _db.closed or _db.broken:
        _db = psycopg.connect(os.environ["PEER_DB_URL"])
    return _db


def _session():
    global _http
    if _http is None:
        _http = requests.Session()
        _http.headers["Authorization"] = f"Bearer {LINE_TOKEN}"
    return _http


def _exec(sql, args, fetch=False):
    conn = _conn()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone() if fetch else None
        conn.commit()
        return row
    except Exception:
        conn.rollback()
        raise


@app.task(name="peer.deliver", bind=True, acks_late=True, max_retries=None, ignore_result=True)
def deliver(self, delivery_id):
    """Claim, POST, mark sent: one delivery (`deliveries.id`)."""
    row = _exec(CLAIM, (delivery_id,), fetch=True)
    if row is None:
        return  # claimed by another attempt, or already final
    recipient, text, retry_key = row
    try:
        resp = _session().post(
            f"{SIM_URL}/v2/bot/message/push",
            json={"to": recipient, "messages": [{"type": "text", "text": text}]},
            headers={"X-Line-Retry-Key": str(retry_key)},
            timeout=10,
        )
        status = resp.status_code
    except requests.RequestException:
        status = None
    if status in (200, 409):  # 409: this retry key was accepted before, so it was sent
        _exec(SENT, (delivery_id,))
    elif status is not None and 400 <= status < 500 and status != 429:
        _exec(BACK, ("failed", delivery_id))
    else:
        _exec(BACK, ("pending", delivery_id))
        raise self.retry(countdown=1)
