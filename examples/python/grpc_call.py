#!/usr/bin/env python3
"""grpcurl-style calls to the platform's gRPC API from the shell, with no .proto file:
the services and messages are read from the server's reflection service (ingest serves
grpc.reflection.v1 and v1alpha) with `grpcio-reflection`, the request is JSON on the
command line (proto3 JSON: field names as in the .proto or lowerCamelCase), the answer
is printed as JSON. Debian packages no grpcurl, so this stands in for it.

    grpc_call.py list                                   # the services
    grpc_call.py describe notify.v1.CreateEventRequest  # a service, method or message
    grpc_call.py notify.v1.IngestService/CreateEvent '{"event_key": "order:1001:paid", ...}'

What it does on every call, as a caller's code should:
  * sends the API key as `authorization: Bearer <key>` metadata (NOTIFY_API_KEY; none
    when unset, for a server with NOTIFY_GRPC_AUTH=off);
  * a deadline of NOTIFY_DEADLINE seconds (default 10);
  * retries only UNAVAILABLE, up to 5 tries, with the same request (so a CreateEvent
    keeps its event_key and a retry that reached the server answers duplicate = true);
  * on an error prints `ERROR <CODE>: <message>` on stderr and, for INVALID_ARGUMENT,
    each field violation of the google.rpc.BadRequest in grpc-status-details-bin as a
    `field: rule` line on stdout; exit 1.

Environment: NOTIFY_GRPC_ADDR (host:port, default 127.0.0.1:50051), NOTIFY_API_KEY,
NOTIFY_DEADLINE. Exit codes: 0 answered, 1 a gRPC error, 64 bad usage.
"""

import json
import os
import sys
import time

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status

MAX_TRIES = 5
# Scalar field types by number, as the .proto spells them.
SCALARS = {v: k[len("TYPE_"):].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
FIRST_BACKOFF_SECONDS = 0.2


def usage() -> int:
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 64


def with_retry(fn):
    """Runs `fn` (one call); retries only UNAVAILABLE, backing off, then raises."""
    backoff = FIRST_BACKOFF_SECONDS
    for attempt in range(1, MAX_TRIES + 1):
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or attempt == MAX_TRIES:
                raise
            print(f"UNAVAILABLE ({err.details()}), retry {attempt} in {backoff:.1f}s", file=sys.stderr)
            time.sleep(backoff)
            backoff *= 2
    raise AssertionError("unreachable")


def report(err: grpc.RpcError) -> int:
    """Prints the error, and the BadRequest's field violations one per line."""
    print(f"ERROR {err.code().name}: {err.details()}", file=sys.stderr)
    status = rpc_status.from_call(err)
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            for v in bad.field_violations:
                print(f"{v.field}: {v.description}")
    return 1


def describe(pool, name: str) -> int:
    """Prints the service, method or message `name` (a full name), asking the server's
    reflection for the file that defines it once."""
    # The server's reflection knows services and messages; a method by its service.
    file = None
    for symbol in (name, name.rsplit(".", 1)[0]):
        try:
            file = with_retry(lambda: pool.FindFileContainingSymbol(symbol))
            break
        except KeyError:
            continue
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
    if file is None:
        print(f"{name}: not found on the server", file=sys.stderr)
        return 1
    local = name[len(file.package) + 1:] if file.package else name
    head, _, tail = local.partition(".")
    if local in file.services_by_name:
        service = file.services_by_name[local]
        print(f"service {service.full_name}")
        for m in service.methods:
            print(f"  rpc {m.name}({m.input_type.full_name}) returns ({m.output_type.full_name})")
    elif local in file.message_types_by_name:
        message = file.message_types_by_name[local]
        print(f"message {message.full_name}")
        for f in message.fields:
            kind = f.message_type.full_name if f.message_type else f.enum_type.full_name if f.enum_type else SCALARS[f.type]
            repeated = "repeated " if f.is_repeated else ""
            print(f"  {repeated}{kind} {f.name} = {f.number}  (JSON {f.json_name})")
    elif head in file.services_by_name and tail in file.services_by_name[head].methods_by_name:
        m = file.services_by_name[head].methods_by_name[tail]
        print(f"rpc {m.full_name}({m.input_type.full_name}) returns ({m.output_type.full_name})")
    else:
        print(f"{name}: not a service, method or top-level message", file=sys.stderr)
        return 1
    return 0


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        return usage()
    addr = os.environ.get("NOTIFY_GRPC_ADDR", "127.0.0.1:50051")
    key = os.environ.get("NOTIFY_API_KEY", "").strip()
    metadata = [("authorization", f"Bearer {key}")] if key else []
    deadline = float(os.environ.get("NOTIFY_DEADLINE", "10"))

    with grpc.insecure_channel(addr) as channel:
        # The reflection service needs no key; the descriptors come from the server.
        reflection = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(reflection)
        try:
            if argv[0] == "list":
                for name in with_retry(reflection.get_services):
                    print(name)
                return 0
            if argv[0] == "describe" and len(argv) == 2:
                return describe(pool, argv[1].replace("/", "."))
            if "/" not in argv[0] or len(argv) > 2:
                return usage()
            service_name, method_name = argv[0].split("/", 1)
            try:
                service = with_retry(lambda: pool.FindServiceByName(service_name))
                method = service.methods_by_name[method_name]
            except KeyError:
                print(f"{argv[0]}: no such method on the server", file=sys.stderr)
                return 1
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            request = json_format.Parse(argv[1] if len(argv) == 2 else "{}", request_class())
            call = channel.unary_unary(
                f"/{service.full_name}/{method.name}",
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            response = with_retry(lambda: call(request, timeout=deadline, metadata=metadata))
        except grpc.RpcError as err:
            return report(err)
        except json_format.ParseError as err:
            print(f"the request is not a {method.input_type.full_name}: {err}", file=sys.stderr)
            return 64
        print(json.dumps(json_format.MessageToDict(response), indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
