#!/usr/bin/env node
// A receiver of the platform's status webhooks, verified with the Standard Webhooks
// reference library (`standardwebhooks` on npm).
//
// What it verifies: every POST's `webhook-id`, `webhook-timestamp` and `webhook-signature`
// headers against the raw body, with `new Webhook(secret).verify(...)` (HMAC-SHA256 over
// `id.timestamp.body`, and the library's own 5-minute timestamp tolerance). It answers 204
// when a secret verifies it and 400 with `{"error": "..."}` when none does; 405 for any
// method but POST and 413 for a body over 1 MiB. See docs/webhooks.md.
//
// Run it (Node 20 or later):
//
//     (cd examples/node && npm ci)
//     WEBHOOK_SECRET=whsec_... node examples/node/webhook-receiver.mjs
//
// Environment:
//     WEBHOOK_SECRET  one or more `whsec_...` secrets, comma-separated: a request verifies
//                     when any of them verifies it (during a secret rotation a receiver
//                     may know the old one, the new one, or both)
//     HOST, PORT      where to listen (127.0.0.1, 8000; PORT=0 picks a free port)
//     WEBHOOK_LOG     optional file; one JSON line per POST is appended to it
//
// When ready it prints `listening on http://HOST:PORT/` (the real port). SIGTERM or
// SIGINT stops it with exit code 0.
//
// What a real receiver should do, and this one does (only to report it in its log):
//   * deduplicate on `webhook-id`: the platform delivers at least once, so the same
//     message can arrive more than once (`"duplicate": true`), with the same id every time;
//   * order by `state_version`: messages may arrive in any order, so keep the highest
//     `state_version` seen per `delivery_id` and ignore a lower one (`"stale": true`).
// A real receiver would keep both in its database, and do its work after answering 2xx
// quickly (the platform's timeout is 5 s).

import fs from "node:fs";
import http from "node:http";
import { Webhook } from "standardwebhooks";

const MAX_BODY = 1024 * 1024; // bytes; a larger body is refused with 413
// A refused body up to this size is read and dropped before the answer, so the sender sees
// the 413 (a connection closed on an unread body may be reset).
const MAX_DRAIN = 16 * MAX_BODY;

const secrets = (process.env.WEBHOOK_SECRET ?? "")
  .split(",")
  .map((s) => s.trim())
  .filter((s) => s !== "");
if (secrets.length === 0) {
  console.error("WEBHOOK_SECRET is not set (one or more whsec_... secrets, comma-separated)");
  process.exit(1);
}
let webhooks;
try {
  webhooks = secrets.map((s) => new Webhook(s));
} catch (e) {
  console.error(`WEBHOOK_SECRET: ${e.message}`);
  process.exit(1);
}
const host = process.env.HOST || "127.0.0.1";
const port = Number.parseInt(process.env.PORT || "8000", 10);
const logFd = process.env.WEBHOOK_LOG ? fs.openSync(process.env.WEBHOOK_LOG, "a") : null;

// What the receiver remembers (a real one keeps these in its database).
const seenIds = new Set();
const versions = new Map(); // delivery_id -> highest state_version

/** Appends one JSON line to the log; a synchronous write, so each line is flushed. */
function writeLog(line) {
  if (logFd !== null) fs.writeSync(logFd, `${JSON.stringify(line)}\n`);
}

/** The parsed body when any secret verifies it; throws the last error otherwise. */
function verify(body, headers) {
  let error;
  for (const wh of webhooks) {
    try {
      wh.verify(body, headers, { jsonParse: false });
      return JSON.parse(body);
    } catch (e) {
      error = e;
    }
  }
  throw error;
}

/** The log line of a verified message: duplicate / stale, then remembered. */
function record(webhookId, payload) {
  const data = payload && typeof payload.data === "object" && payload.data !== null ? payload.data : {};
  const deliveryId = data.delivery_id ?? null;
  const version = data.state_version ?? null;
  const duplicate = seenIds.has(webhookId);
  seenIds.add(webhookId);
  let stale = false;
  if (deliveryId !== null && Number.isInteger(version)) {
    const highest = versions.get(deliveryId);
    stale = highest !== undefined && highest > version;
    if (!stale) versions.set(deliveryId, version);
  }
  return {
    webhook_id: webhookId,
    verified: true,
    duplicate,
    type: payload?.type ?? null,
    delivery_id: deliveryId,
    state_version: version,
    status: data.status ?? null,
    stale,
  };
}

function answer(res, status, body, extra = {}) {
  if (body === null) {
    res.writeHead(status, extra).end();
  } else {
    const raw = JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json", ...extra }).end(raw);
  }
}

const header = (req, name) => {
  const v = req.headers[name];
  return Array.isArray(v) ? v.join(", ") : (v ?? "");
};

const server = http.createServer((req, res) => {
  if (req.method !== "POST") {
    req.resume();
    answer(res, 405, { error: "only POST" }, { allow: "POST" });
    return;
  }
  const webhookId = req.headers["webhook-id"] ?? null;
  const tooLarge = () => {
    writeLog({ webhook_id: webhookId, verified: false, error: "body larger than 1 MiB" });
    answer(res, 413, { error: "body larger than 1 MiB" }, { connection: "close" });
  };
  if (Number.parseInt(req.headers["content-length"] ?? "0", 10) > MAX_DRAIN) {
    tooLarge();
    req.destroy();
    return;
  }
  let chunks = [];
  let size = 0;
  let refused = false;
  req.on("data", (chunk) => {
    if (refused) return;
    size += chunk.length;
    if (size > MAX_DRAIN) {
      refused = true;
      tooLarge();
      req.destroy();
    } else if (size > MAX_BODY) {
      chunks = []; // dropped; 413 once the body is read
    } else {
      chunks.push(chunk);
    }
  });
  req.on("end", () => {
    if (refused) return;
    if (size > MAX_BODY) {
      tooLarge();
      return;
    }
    const body = Buffer.concat(chunks).toString("utf8");
    const headers = {
      "webhook-id": header(req, "webhook-id"),
      "webhook-timestamp": header(req, "webhook-timestamp"),
      "webhook-signature": header(req, "webhook-signature"),
    };
    let payload;
    try {
      payload = verify(body, headers);
    } catch (e) {
      const error = e?.message || String(e);
      writeLog({ webhook_id: webhookId, verified: false, error });
      answer(res, 400, { error });
      return;
    }
    writeLog(record(webhookId, payload));
    answer(res, 204, null);
  });
});

// Node's default keep-alive timeout (5 s) equals the platform's request timeout; a bit
// longer avoids racing a reused connection's close.
server.keepAliveTimeout = 30_000;

const stop = () => {
  server.close();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);

server.listen(port, host, () => {
  process.stdout.write(`listening on http://${host}:${server.address().port}/\n`);
});
