"""Runs the Celery peer once and prints its figures (see README.md, "Chaos and benchmark").

Steps, against the shared RabbitMQ, Postgres and provider simulator:

1. recreates the peer's own database (NOTIFY_PEER_DATABASE, default notify_peer_celery)
   with its two tables, and declares its own queue (names prefixed NOTIFY_PEER_PREFIX);
2. ingest: NOTIFY_PEER_PRODUCERS producer processes (default 8: Python holds one core per
   process, and each waits on its commit and on the publish confirms, so more processes
   than cores keep both cores busy) insert NOTIFY_PEER_EVENTS events (default 3,334),
   each one transaction with the event and three deliveries, and enqueue one task per
   delivery after the commit (`apply_async`, publisher confirms on), with no worker
   running: events/s and deliveries/s committed and enqueued;
3. starts the Celery worker (prefork, 4 processes, acks_late, prefetch multiplier 1) and
   lets it drain that backlog;
4. end to end: the producers send as many events again while the worker runs; the rate
   is the phase's deliveries over the time from the first enqueue to the last `sent`
   (Postgres' clock_timestamp() of the last mark);
5. stops every process it started (by pid), deletes its queue and exchange, counts the
   rows: every delivery the producers committed must be `sent` in Postgres and its push
   (found by its X-Line-Retry-Key) answered 200 by the simulator, once; prints one line
   `peer (celery, 4 prefork, acks_late): ingest E events/s (D deliveries/s), end to end X
   deliveries/s, N deliveries, L lost` (L: committed but not both sent and accepted) and
   the redeliveries (attempts > 1). Exits 1 when a delivery was lost or pushed twice, a
   producer failed, or a phase ran past NOTIFY_PEER_TIMEOUT.

Environment: NOTIFY_DATABASE_URL (the peer's database replaces its name), NOTIFY_AMQP_URL,
NOTIFY_SIM_URL, NOTIFY_LINE_CHANNEL_TOKEN, NOTIFY_LOG_DIR (worker log), and the
NOTIFY_PEER_* settings above. NOTIFY_PEER_KEEP_DB=1 keeps the database for a look.
"""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import requests
from kombu import Connection, Exchange, Queue

HERE = os.path.dirname(os.path.abspath(__file__))

SCHEMA = """
CREATE TABLE events (
    id bigserial PRIMARY KEY,
    phase text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE deliveries (
    id bigserial PRIMARY KEY,
    event_id bigint NOT NULL REFERENCES events (id),
    channel text NOT NULL,
    recipient text NOT NULL,
    body text NOT NULL,
    retry_key uuid NOT NULL DEFAULT gen_random_uuid(),
    status text NOT NULL DEFAULT 'pending',
    attempts int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deliveries_event_id ON deliveries (event_id);
"""


def log(msg):
    print(f"peer: {msg}", file=sys.stderr, flush=True)


def env_int(name, default):
    return int(os.environ.get(name, default))


def with_db(url, db):
    base, _, _ = url.rpartition("/")
    return f"{base}/{db}"


def producer(idx, n_events, phase, barrier, out):
    """One producer process: n_events transactions of 1 event + 3 deliveries, then one
    apply_async per delivery after each commit. Puts (idx, events, deliveries, end, error)."""
    events = deliveries = 0
    error = None
    try:
        from peer import app, deliver

        conn = psycopg.connect(os.environ["PEER_DB_URL"], autocommit=True)
        with app.connection_for_write() as c:  # connect before the clock starts
            c.ensure_connection(max_retries=3)
        barrier.wait()
        for i in range(n_events):
            recipients = [f"U{(0xCE1E << 96) + idx * 10_000_000 + i * 3 + k:032x}" for k in range(3)]
            with conn.transaction():
                eid = conn.execute(
                    "INSERT INTO events (phase, type, payload) VALUES (%s, 'peer', %s) RETURNING id",
                    (phase, psycopg.types.json.Jsonb({"title": "peer", "n": i})),
                ).fetchone()[0]
                ids = [
                    r[0]
                    for r in conn.execute(
                        "INSERT INTO deliveries (event_id, channel, recipient, body) "
                        "SELECT %s, 'line', r, %s FROM unnest(%s::text[]) AS r RETURNING id",
                        (eid, f"peer {phase} {i}", recipients),
                    ).fetchall()
                ]
            events += 1
            deliveries += len(ids)
            for d in ids:
                deliver.apply_async((d,))
        conn.close()
    except Exception as e:  # reported, counted as a failure of the run
        error = f"producer {idx}: {type(e).__name__}: {e}"
        try:
            barrier.abort()
        except Exception:
            pass
    out.put((idx, events, deliveries, time.time(), error))


def produce(ctx, phase, producers, n_events):
    """Runs the producers; returns (events, deliveries, t0, t_end, errors)."""
    barrier = ctx.Barrier(producers + 1)
    out = ctx.Queue()
    share = [n_events // producers + (1 if i < n_events % producers else 0) for i in range(producers)]
    procs = [
        ctx.Process(target=producer, args=(i, share[i], phase, barrier, out), daemon=True) for i in range(producers)
    ]
    for p in procs:
        p.start()
    errors = []
    finished = False
    try:
        try:
            barrier.wait(timeout=60)
        except Exception:
            errors.append("producers did not start")
        t0 = time.time()
        results = [out.get(timeout=env_int("NOTIFY_PEER_TIMEOUT", 600)) for _ in procs]
        finished = True
    finally:  # every producer ended (by pid) before this returns or unwinds
        for p in procs:
            if finished:
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    errors += [r[4] for r in results if r[4]]
    return (
        sum(r[1] for r in results),
        sum(r[2] for r in results),
        t0,
        max(r[3] for r in results),
        errors,
    )


def wait_final(db, phase, expected, timeout):
    """Polls until every delivery of `phase` is sent or failed; True if it happened."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = db.execute(
            "SELECT count(*) FROM deliveries d JOIN events e ON e.id = d.event_id "
            "WHERE e.phase = %s AND d.status IN ('sent', 'failed')",
            (phase,),
        ).fetchone()[0]
        if done >= expected:
            return True
        time.sleep(0.1)
    return False


class Worker:
    """The Celery worker process (its own session, stopped by pid)."""

    def __init__(self, env, log_path):
        self.log = open(log_path, "ab")
        cmd = [
            sys.executable, "-m", "celery", "-A", "peer", "worker",
            "--pool=prefork", "--concurrency=4", "--prefetch-multiplier=1",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel=WARNING", "-Q", env["PEER_PREFIX"] + "deliver",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown: the pool's processes too
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"worker {self.proc.pid} did not stop in 30 s; SIGKILL to its group")
        try:  # anything of its own session left (the pool's processes), by its group id
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.log.close()


def main():
    # SIGTERM (a stopped bench) unwinds like Ctrl-C, so the finally below stops the worker.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    producers = env_int("NOTIFY_PEER_PRODUCERS", 8)
    n_events = env_int("NOTIFY_PEER_EVENTS", 3334)
    timeout = env_int("NOTIFY_PEER_TIMEOUT", 600)
    db_name = os.environ.get("NOTIFY_PEER_DATABASE", "notify_peer_celery")
    prefix = os.environ.get("NOTIFY_PEER_PREFIX", f"peer-celery-{uuid.uuid4().hex[:8]}.")
    pg_url = os.environ["NOTIFY_DATABASE_URL"]
    env = dict(os.environ)
    env.update(
        PEER_DB_URL=with_db(pg_url, db_name),
        PEER_BROKER_URL=os.environ["NOTIFY_AMQP_URL"],
        PEER_PREFIX=prefix,
        PYTHONPATH=HERE,
    )
    os.environ.update(env)  # the producers (spawned) read the same
    log_dir = os.environ.get("NOTIFY_LOG_DIR", HERE)
    os.makedirs(log_dir, exist_ok=True)

    with psycopg.connect(with_db(pg_url, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{db_name}"')
    db = psycopg.connect(env["PEER_DB_URL"], autocommit=True)
    db.execute(SCHEMA)

    try:
        return measure(env, db, prefix, producers, n_events, timeout, log_dir)
    finally:
        db.close()
        if os.environ.get("NOTIFY_PEER_KEEP_DB") != "1":
            with psycopg.connect(with_db(pg_url, "postgres"), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


def measure(env, db, prefix, producers, n_events, timeout, log_dir):
    """Steps 2 to 5 of the module's list; returns the exit code."""
    queue = Queue(prefix + "deliver", Exchange(prefix + "deliver", type="direct"), routing_key=prefix + "deliver")
    with Connection(env["PEER_BROKER_URL"]) as c:
        queue(c.default_channel).declare()
        queue(c.default_channel).purge()

    ctx = mp.get_context("spawn")
    failures = []
    worker = None
    try:
        log(f"ingest: {producers} producer processes, {n_events} events x 3 deliveries, no worker running")
        ev, dl, t0, t1, errs = produce(ctx, "ingest", producers, n_events)
        failures += errs
        ingest_s = max(t1 - t0, 1e-9)
        produced = dl

        worker = Worker(env, os.path.join(log_dir, "peer-celery-worker.log"))
        log(f"worker pid {worker.proc.pid}: prefork, 4 processes, acks_late, prefetch multiplier 1")
        drain_t0 = time.time()
        if not wait_final(db, "ingest", dl, timeout):
            failures.append(f"the ingest backlog was not drained in {timeout} s")
        drain_s = time.time() - drain_t0

        log(f"end to end: {n_events} events x 3 deliveries while the worker runs")
        _, dl2, e2e_t0, e2e_t1, errs = produce(ctx, "e2e", producers, n_events)
        failures += errs
        produced += dl2
        if not wait_final(db, "e2e", dl2, timeout):
            failures.append(f"the end-to-end phase did not finish in {timeout} s")
        e2e_sent, last_sent = db.execute(
            "SELECT count(*), extract(epoch FROM max(d.updated_at)) FROM deliveries d JOIN events e ON e.id = d.event_id "
            "WHERE e.phase = 'e2e' AND d.status = 'sent'"
        ).fetchone()
        e2e_s = max(float(last_sent or e2e_t1) - e2e_t0, 1e-9)
    finally:
        if worker:
            worker.stop()
        with Connection(env["PEER_BROKER_URL"]) as c:
            ch = c.default_channel
            try:
                ch.queue_delete(prefix + "deliver")
                ch.exchange_delete(prefix + "deliver")
            except Exception as e:
                log(f"could not delete queue or exchange {prefix}deliver: {e}")

    # The check that cannot lie: rows counted in Postgres against what the producers
    # committed (their own counts), after every process has stopped.
    rows, sent, failed, redelivered = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'failed'), "
        "count(*) FILTER (WHERE attempts > 1) FROM deliveries"
    ).fetchone()
    # And against what the simulator accepted: a `sent` row counts only if a push with its
    # retry key was answered 200 (the simulator records every request it answered).
    accepted = {}
    for r in requests.get(f"{os.environ['NOTIFY_SIM_URL'].rstrip('/')}/_sim/requests?provider=line", timeout=120).json():
        key = r["headers"].get("x-line-retry-key")
        if key and r["status"] == 200:
            accepted[key] = accepted.get(key, 0) + 1
    delivered = duplicates = 0
    for (key,) in db.execute("SELECT retry_key::text FROM deliveries WHERE status = 'sent'"):
        n = accepted.get(key, 0)
        delivered += n > 0
        duplicates += max(n - 1, 0)
    lost = produced - delivered
    if sent != delivered:
        failures.append(f"{sent - delivered} deliveries marked sent that the simulator never accepted")
    if duplicates:
        failures.append(f"{duplicates} pushes accepted twice for one delivery")
    if rows != produced:
        failures.append(f"{rows} delivery rows in Postgres, the producers committed {produced}")
    if lost:
        failures.append(f"{lost} deliveries not sent ({failed} failed)")
    print(
        f"peer: ingest phase {dl} deliveries in {ingest_s:.1f} s; the worker started and drained them in "
        f"{drain_s:.1f} s; end-to-end phase {e2e_sent} of {dl2} deliveries sent in {e2e_s:.1f} s; "
        f"{sent} sent in Postgres, {delivered} of them accepted by the simulator, {duplicates} duplicates; "
        f"redeliveries (attempts > 1) {redelivered}; {producers} producer processes, publisher confirms on"
    )
    print(
        f"peer (celery, 4 prefork, acks_late): ingest {ev / ingest_s:.0f} events/s ({dl / ingest_s:.0f} deliveries/s), "
        f"end to end {e2e_sent / e2e_s:.0f} deliveries/s, {produced} deliveries, {lost} lost",
        flush=True,
    )
    for f in failures:
        log(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
