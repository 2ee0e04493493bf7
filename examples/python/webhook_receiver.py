#!/usr/bin/env python3
"""A receiver of the platform's status webhooks, verified with the Standard Webhooks
reference library (`standardwebhooks` on PyPI).

What it verifies: every POST's `webhook-id`, `webhook-timestamp` and `webhook-signature`
headers against the raw body, with `standardwebhooks.Webhook.verify` (HMAC-SHA256 over
`id.timestamp.body`, and the library's own 5-minute timestamp tolerance). It answers 204
when a secret verifies it and 400 with `{"error": "..."}` when none does; 405 for any
method but POST and 413 for a body over 1 MiB. See docs/webhooks.md.

Run it:

    python3 -m venv venv && venv/bin/pip install -r examples/python/requirements.txt
    WEBHOOK_SECRET=whsec_... venv/bin/python examples/python/webhook_receiver.py

Environment:
    WEBHOOK_SECRET  one or more `whsec_...` secrets, comma-separated: a request verifies
                    when any of them verifies it (during a secret rotation a receiver may
                    know the old one, the new one, or both)
    HOST, PORT      where to listen (127.0.0.1, 8000; PORT=0 picks a free port)
    WEBHOOK_LOG     optional file; one JSON line per POST is appended to it

When ready it prints `listening on http://HOST:PORT/` (the real port). SIGTERM or SIGINT
stops it with exit code 0.

What a real receiver should do, and this one does (only to report it in its log):
  * deduplicate on `webhook-id`: the platform delivers at least once, so the same
    message can arrive more than once (`"duplicate": true`), with the same id every time;
  * order by `state_version`: messages may arrive in any order, so keep the highest
    `state_version` seen per `delivery_id` and ignore a lower one (`"stale": true`).
A real receiver would keep both in its database, and do its work after answering 2xx
quickly (the platform's timeout is 5 s).
"""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

MAX_BODY = 1024 * 1024  # bytes; a larger body is refused with 413
MAX_DRAIN = 16 * MAX_BODY  # a refused body up to this size is read and dropped before the
# answer, so the sender sees the 413 (a connection closed on an unread body may be reset)


class State:
    """What the receiver remembers: the verified webhook-ids, the highest state_version per
    delivery_id, and the log file. One lock guards all three."""

    def __init__(self, webhooks, log_path):
        self.webhooks = webhooks
        self.lock = threading.Lock()
        self.seen_ids = set()
        self.versions = {}
        self.log = open(log_path, "a", encoding="utf-8") if log_path else None

    def verify(self, body, headers):
        """The parsed body when any secret verifies it; raises the last error otherwise."""
        error = None
        for wh in self.webhooks:
            try:
                wh.verify(body, headers, json_parse=False)
                return json.loads(body)
            except (WebhookVerificationError, ValueError) as e:
                error = e
        raise error

    def record(self, webhook_id, payload):
        """The log line of a verified message: duplicate / stale, then remembered."""
        data = payload.get("data") if isinstance(payload, dict) else None
        data = data if isinstance(data, dict) else {}
        delivery_id = data.get("delivery_id")
        version = data.get("state_version")
        with self.lock:
            duplicate = webhook_id in self.seen_ids
            self.seen_ids.add(webhook_id)
            stale = False
            if delivery_id is not None and isinstance(version, int):
                highest = self.versions.get(delivery_id)
                stale = highest is not None and highest > version
                if not stale:
                    self.versions[delivery_id] = version
        return {
            "webhook_id": webhook_id,
            "verified": True,
            "duplicate": duplicate,
            "type": payload.get("type") if isinstance(payload, dict) else None,
            "delivery_id": delivery_id,
            "state_version": version,
            "status": data.get("status"),
            "stale": stale,
        }

    def write(self, line):
        if self.log is None:
            return
        with self.lock:
            self.log.write(json.dumps(line) + "\n")
            self.log.flush()


class BodyTooLarge(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the platform reuses its connections
    server_version = "webhook-receiver"
    state = None  # set in main()

    def log_message(self, format, *args):  # noqa: A002 - quiet: the JSON log says it all
        pass

    def __getattr__(self, name):
        # http.server dispatches to do_<METHOD>: everything but POST is 405.
        if name.startswith("do_"):
            return self.not_allowed
        raise AttributeError(name)

    def not_allowed(self):
        self.drain()
        self.answer(405, {"error": "only POST"}, [("Allow", "POST")])

    def do_POST(self):
        webhook_id = self.headers.get("webhook-id")
        try:
            body = self.read_body()
        except BodyTooLarge:
            self.close_connection = True
            self.state.write({"webhook_id": webhook_id, "verified": False, "error": "body larger than 1 MiB"})
            self.answer(413, {"error": "body larger than 1 MiB"})
            return
        except ValueError:  # a malformed Content-Length or chunk size
            self.close_connection = True
            self.state.write({"webhook_id": webhook_id, "verified": False, "error": "malformed request body"})
            self.answer(400, {"error": "malformed request body"})
            return
        headers = {k: self.headers.get(k, "") for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
        try:
            text = body.decode("utf-8")
            payload = self.state.verify(text, headers)
        except (WebhookVerificationError, ValueError) as e:
            error = str(e) or type(e).__name__
            self.state.write({"webhook_id": webhook_id, "verified": False, "error": error})
            self.answer(400, {"error": error})
            return
        self.state.write(self.state.record(webhook_id, payload))
        self.answer(204, None)

    def read_body(self):
        """The request body (Content-Length or chunked); BodyTooLarge past MAX_BODY."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts, size = [], 0
            while True:
                line = self.rfile.readline(1024)
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    if size > MAX_BODY:
                        raise BodyTooLarge()
                    return b"".join(parts)
                size += n
                if size > MAX_DRAIN:
                    raise BodyTooLarge()
                chunk = self.rfile.read(n)
                if size <= MAX_BODY:
                    parts.append(chunk)
                self.rfile.readline(1024)  # CRLF after the chunk
                if size > MAX_BODY:
                    parts = []  # dropped; BodyTooLarge once the body is read
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.discard(length)
            raise BodyTooLarge()
        return self.rfile.read(length)

    def discard(self, length):
        """Reads and drops a refused body of `length` bytes (up to MAX_DRAIN)."""
        left = length if length <= MAX_DRAIN else 0
        while left > 0:
            got = self.rfile.read(min(left, 65536))
            if not got:
                break
            left -= len(got)

    def drain(self):
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= MAX_BODY:
            self.rfile.read(length)
        elif length or self.headers.get("Transfer-Encoding"):
            self.close_connection = True

    def answer(self, status, body, extra=()):
        self.send_response(status)
        for k, v in extra:
            self.send_header(k, v)
        if body is not None:  # a 204 has no body and no Content-Length
            raw = json.dumps(body).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body is not None:
            self.wfile.write(raw)


def main():
    secrets = [s.strip() for s in os.environ.get("WEBHOOK_SECRET", "").split(",") if s.strip()]
    if not secrets:
        sys.exit("WEBHOOK_SECRET is not set (one or more whsec_... secrets, comma-separated)")
    try:
        webhooks = [Webhook(s) for s in secrets]
    except Exception as e:  # a secret that is not base64
        sys.exit(f"WEBHOOK_SECRET: {e}")
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    Handler.state = State(webhooks, os.environ.get("WEBHOOK_LOG"))

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True

    def stop(_signum, _frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening on http://{host}:{server.server_address[1]}/", flush=True)
    server.serve_forever(poll_interval=0.1)
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
