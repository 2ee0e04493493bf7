#!/usr/bin/env python3
"""An end user's token for the inbox API (`/v1/inbox/...` on http-api), for trying it
locally: an HS256 JWT whose `sub` is the user id, valid for an hour, signed with
NOTIFY_INBOX_JWT_SECRET (the local stack's env file sets it). Standard library only.
In production your own sign-in service issues these tokens (see docs/openapi.json).

    TOKEN=$(python3 examples/python/inbox_token.py customer-1001)
    curl -H "Authorization: Bearer $TOKEN" "$NOTIFY_HTTP_URL/v1/inbox/notifications"
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: inbox_token.py USER_ID", file=sys.stderr)
        return 64
    secret = os.environ.get("NOTIFY_INBOX_JWT_SECRET")
    if not secret:
        print("NOTIFY_INBOX_JWT_SECRET is not set (source the stack's env file)", file=sys.stderr)
        return 64
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64url(json.dumps({"sub": sys.argv[1], "exp": int(time.time()) + 3600}).encode())
    signature = hmac.new(secret.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    print(f"{header}.{claims}.{b64url(signature)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
