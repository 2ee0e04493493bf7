#!/usr/bin/env python3
"""Send one notification event to the platform's gRPC API and read back what happened
to it: a caller's service in Python, on the standard gRPC stack (`grpcio`), with the
code generated from `proto/notify/v1/notify.proto` by `grpcio-tools` when it starts.

What it shows a team copying it:
  * the API key in the `authorization: Bearer <key>` metadata of every call;
  * a deadline on every call (10 s);
  * retries only on UNAVAILABLE, with the same request and so the same `event_key`:
    the platform deduplicates on it, so a retry of a call that did reach the server
    answers `duplicate = true` instead of sending twice. Any other error is final;
  * the field violations of INVALID_ARGUMENT (a `google.rpc.BadRequest` in the
    `grpc-status-details-bin` trailer), one `field: rule` line each;
  * GetEvent until every delivery is final, one line per delivery.

Run it (the venv `deploy/local-stack.sh up` makes has the packages of
requirements-grpc.txt; any venv with them does):

    NOTIFY_API_KEY=nk_... .stack/examples/venv/bin/python examples/python/send_event.py
    NOTIFY_API_KEY=nk_... .stack/examples/venv/bin/python examples/python/send_event.py --bad

Arguments: [--bad] [--event-key KEY] [--user ID] [--type TYPE]
    --event-key  default order:1001:paid
    --user       the recipient's user id, default customer-1001
    --type       a registered notification type, default order_paid
    --bad        send an invalid event instead (a blank event key, a blank recipient and a
                 payload that is not JSON) and print its field violations

Environment:
    NOTIFY_GRPC_ADDR   host:port of ingest's gRPC API (default 127.0.0.1:50051)
    NOTIFY_API_KEY     the caller's API key (`notifyctl keys create`), required
    NOTIFY_PROTO_DIR   the folder holding notify/v1/notify.proto (default: the
                       repository's proto/, found from this file's place)

Output: `event <id> created` (or `duplicate`), then `<channel> <user> <status> attempts=<n>`
per delivery (and `skipped <channel> <user> <reason>` per skipped pair). Exit codes: 0
delivered or final; 1 a gRPC error (its code and message on stderr); 2 the invalid event
was refused as expected (--bad), its violations on stdout.
"""

import argparse
import importlib.resources
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_status import rpc_status
from grpc_tools import protoc
from google.rpc import error_details_pb2

DEADLINE_SECONDS = 10.0
# Tries of one call on UNAVAILABLE, and the pause before each retry (doubling).
MAX_TRIES = 5
FIRST_BACKOFF_SECONDS = 0.2
# How long to wait for every delivery to be final.
WAIT_FINAL_SECONDS = 30.0


def generate(proto_dir: Path):
    """Generates notify/v1/notify_pb2.py and notify_pb2_grpc.py from the .proto into a
    temporary folder and imports them: the code always matches the proto it runs with."""
    proto = proto_dir / "notify" / "v1" / "notify.proto"
    if not proto.is_file():
        sys.exit(f"{proto} not found: set NOTIFY_PROTO_DIR to the folder holding notify/v1/")
    out = tempfile.mkdtemp(prefix="notify-proto-")
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    code = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(proto),
    ])
    if code != 0:
        sys.exit(f"protoc failed on {proto} (exit {code})")
    sys.path.insert(0, out)
    from notify.v1 import notify_pb2, notify_pb2_grpc  # noqa: E402 (generated just now)

    return notify_pb2, notify_pb2_grpc


def call_with_retry(method, request, metadata):
    """Calls `method` with a deadline; retries only UNAVAILABLE (the same request, so the
    same event_key), backing off; any other error is raised at once."""
    backoff = FIRST_BACKOFF_SECONDS
    for attempt in range(1, MAX_TRIES + 1):
        try:
            return method(request, timeout=DEADLINE_SECONDS, metadata=metadata)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or attempt == MAX_TRIES:
                raise
            print(f"UNAVAILABLE ({err.details()}), retry {attempt} in {backoff:.1f}s", file=sys.stderr)
            time.sleep(backoff)
            backoff *= 2
    raise AssertionError("unreachable")


def field_violations(err: grpc.RpcError):
    """The (field, description) pairs of the google.rpc.BadRequest in the error's
    grpc-status-details-bin trailer; empty when it carries none."""
    status = rpc_status.from_call(err)
    if status is None:
        return []
    found = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            found += [(v.field, v.description) for v in bad.field_violations]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description="Send one event and read back its deliveries.")
    ap.add_argument("--bad", action="store_true", help="send an invalid event and print its field violations")
    ap.add_argument("--event-key", default="order:1001:paid")
    ap.add_argument("--user", default="customer-1001")
    ap.add_argument("--type", default="order_paid")
    args = ap.parse_args()

    addr = os.environ.get("NOTIFY_GRPC_ADDR", "127.0.0.1:50051")
    key = os.environ.get("NOTIFY_API_KEY", "").strip()
    if not key:
        sys.exit("NOTIFY_API_KEY is not set (create one with `notifyctl keys create`)")
    default_proto = Path(__file__).resolve().parent.parent.parent / "proto"
    pb, pb_grpc = generate(Path(os.environ.get("NOTIFY_PROTO_DIR", default_proto)))

    metadata = [("authorization", f"Bearer {key}")]
    with grpc.insecure_channel(addr) as channel:
        ingest = pb_grpc.IngestServiceStub(channel)
        if args.bad:
            request = pb.CreateEventRequest(
                event_key="", type=args.type, recipients=[""], payload="{not json",
                content=pb.Content(title="Order paid"),
            )
        else:
            # The order a key of the form order:<id>:... names, as a real caller has it.
            parts = args.event_key.split(":")
            order_id = parts[1] if len(parts) >= 3 and parts[0] == "order" else "1001"
            request = pb.CreateEventRequest(
                event_key=args.event_key,
                type=args.type,
                recipients=[args.user],
                payload=json.dumps({"order_id": order_id, "amount": "1,250.00"}),
                content=pb.Content(title=f"Order {order_id} paid", body="We received 1,250.00 THB. Thank you!"),
            )
        try:
            created = call_with_retry(ingest.CreateEvent, request, metadata)
        except grpc.RpcError as err:
            print(f"CreateEvent failed: {err.code().name}: {err.details()}", file=sys.stderr)
            violations = field_violations(err)
            for field, rule in violations:
                print(f"{field}: {rule}")
            return 2 if args.bad and err.code() == grpc.StatusCode.INVALID_ARGUMENT and violations else 1
        if args.bad:
            print(f"the invalid event was accepted as {created.event_id}", file=sys.stderr)
            return 1
        print(f"event {created.event_id} {'duplicate' if created.duplicate else 'created'}")

        # Read it back until every delivery is final (sent, failed, skipped, canceled).
        get = pb.GetEventRequest(event_id=created.event_id)
        waited_until = time.monotonic() + WAIT_FINAL_SECONDS
        while True:
            try:
                event = call_with_retry(ingest.GetEvent, get, metadata)
            except grpc.RpcError as err:
                print(f"GetEvent failed: {err.code().name}: {err.details()}", file=sys.stderr)
                return 1
            pending = [d for d in event.deliveries if d.status in ("pending", "sending")]
            if not pending or time.monotonic() > waited_until:
                break
            time.sleep(0.5)
        for d in event.deliveries:
            error = f" last_error={d.last_error}" if d.last_error else ""
            print(f"{d.channel} {d.user_id} {d.status} attempts={d.attempts}{error}")
        for s in event.skipped:
            print(f"skipped {s.channel} {s.user_id} {s.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
