#!/usr/bin/env node
// Send one notification event to the platform's gRPC API and read back what happened to
// it: a caller's service in Node.js, on the standard gRPC stack (@grpc/grpc-js), with the
// service and messages loaded from proto/notify/v1/notify.proto by @grpc/proto-loader
// when it starts (the code always matches the proto it runs with).
//
// What it shows a team copying it:
//   * the API key in the `authorization: Bearer <key>` metadata of every call;
//   * a deadline on every call (10 s);
//   * retries only on UNAVAILABLE, with the same request and so the same event_key: the
//     platform deduplicates on it, so a retry of a call that did reach the server
//     answers duplicate = true instead of sending twice. Any other error is final;
//   * the field violations of INVALID_ARGUMENT (a google.rpc.BadRequest inside the
//     google.rpc.Status of the grpc-status-details-bin trailer, decoded with the
//     googleapis protos of google-proto-files
//     and protobufjs), one `field: rule` line each;
//   * GetEvent until every delivery is final, one line per delivery.
//
// Run it (after `npm ci` in examples/node; `deploy/local-stack.sh up` does it):
//
//   NOTIFY_API_KEY=nk_... node examples/node/send-event.mjs
//   NOTIFY_API_KEY=nk_... node examples/node/send-event.mjs --bad
//
// Arguments: [--bad] [--event-key KEY] [--user ID] [--type TYPE]; defaults
// order:1001:paid, customer-1001, order_paid. --bad sends an invalid event (a blank event
// key, a blank recipient, a payload that is not JSON) and prints its field violations.
//
// Environment: NOTIFY_GRPC_ADDR (host:port, default 127.0.0.1:50051), NOTIFY_API_KEY
// (required), NOTIFY_PROTO_DIR (the folder holding notify/v1/notify.proto; default the
// repository's proto/).
//
// Output and exit codes as examples/python/send_event.py: `event <id> created` (or
// `duplicate`), `<channel> <user> <status> attempts=<n>` per delivery; 0 done, 1 a gRPC
// error, 2 the invalid event refused as expected (--bad).

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { getProtoPath } from 'google-proto-files';
import protobuf from 'protobufjs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';

const DEADLINE_MS = 10_000;
// Tries of one call on UNAVAILABLE, and the pause before each retry (doubling).
const MAX_TRIES = 5;
const FIRST_BACKOFF_MS = 200;
// How long to wait for every delivery to be final.
const WAIT_FINAL_MS = 30_000;

const { values: args } = parseArgs({
  options: {
    bad: { type: 'boolean', default: false },
    'event-key': { type: 'string', default: 'order:1001:paid' },
    user: { type: 'string', default: 'customer-1001' },
    type: { type: 'string', default: 'order_paid' },
  },
});

const addr = process.env.NOTIFY_GRPC_ADDR || '127.0.0.1:50051';
const key = (process.env.NOTIFY_API_KEY || '').trim();
if (!key) {
  console.error('NOTIFY_API_KEY is not set (create one with `notifyctl keys create`)');
  process.exit(1);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const protoDir = process.env.NOTIFY_PROTO_DIR || path.resolve(here, '../../proto');

const loadOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const notify = grpc.loadPackageDefinition(
  protoLoader.loadSync('notify/v1/notify.proto', { ...loadOptions, includeDirs: [protoDir] }),
).notify.v1;
// google.rpc.Status and google.rpc.BadRequest from the googleapis protos, to read the
// error details (protobufjs is the library @grpc/proto-loader itself parses with).
const googleapis = new protobuf.Root();
googleapis.resolvePath = (_origin, target) => getProtoPath('..', target);
googleapis.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
const RpcStatus = googleapis.lookupType('google.rpc.Status');
const BadRequest = googleapis.lookupType('google.rpc.BadRequest');

/** `request`, once every field it names is a field of the proto's message `type` (nested
 * messages too): proto-loader drops unknown fields silently, so without this a field
 * renamed in the proto would go unnoticed until the server refuses the request. */
function checked(type, request) {
  const fields = new Map(type.type.field.map((f) => [f.name, f]));
  for (const [name, value] of Object.entries(request)) {
    const field = fields.get(name);
    if (!field) throw new Error(`${type.type.name} has no field ${name}: does this code match proto/notify/v1?`);
    const nested = field.typeName && notify[field.typeName.split('.').pop()];
    if (nested?.type?.field && value && typeof value === 'object' && !Array.isArray(value)) checked(nested, value);
  }
  return request;
}

const metadata = new grpc.Metadata();
metadata.set('authorization', `Bearer ${key}`);

/** Calls `client[method]` with a deadline; retries only UNAVAILABLE (the same request, so
 * the same event_key), backing off; any other error is thrown at once. */
async function callWithRetry(client, method, request) {
  let backoff = FIRST_BACKOFF_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await new Promise((resolve, reject) =>
        client[method](request, metadata, { deadline: Date.now() + DEADLINE_MS }, (err, reply) =>
          err ? reject(err) : resolve(reply),
        ),
      );
    } catch (err) {
      if (err.code !== grpc.status.UNAVAILABLE || attempt === MAX_TRIES) throw err;
      console.error(`UNAVAILABLE (${err.details}), retry ${attempt} in ${backoff / 1000}s`);
      await sleep(backoff);
      backoff *= 2;
    }
  }
}

/** The [field, description] pairs of the google.rpc.BadRequest in the error's
 * grpc-status-details-bin trailer; empty when it carries none. */
function fieldViolations(err) {
  const bin = err.metadata?.get('grpc-status-details-bin')?.[0];
  if (!bin) return [];
  const found = [];
  for (const detail of RpcStatus.decode(bin).details) {
    if (detail.type_url === `type.googleapis.com/${BadRequest.fullName.slice(1)}`) {
      for (const v of BadRequest.decode(detail.value).field_violations) found.push([v.field, v.description]);
    }
  }
  return found;
}

// The order a key of the form order:<id>:... names, as a real caller has it.
function orderOf(eventKey) {
  const parts = eventKey.split(':');
  return parts.length >= 3 && parts[0] === 'order' ? parts[1] : '1001';
}

async function main() {
  const ingest = new notify.IngestService(addr, grpc.credentials.createInsecure());
  const order = orderOf(args['event-key']);
  const request = checked(notify.CreateEventRequest, args.bad
    ? { event_key: '', type: args.type, recipients: [''], payload: '{not json', content: { title: 'Order paid' } }
    : {
        event_key: args['event-key'],
        type: args.type,
        recipients: [args.user],
        payload: JSON.stringify({ order_id: order, amount: '1,250.00' }),
        content: { title: `Order ${order} paid`, body: 'We received 1,250.00 THB. Thank you!' },
      });
  let created;
  try {
    created = await callWithRetry(ingest, 'CreateEvent', request);
  } catch (err) {
    console.error(`CreateEvent failed: ${grpc.status[err.code]}: ${err.details}`);
    const violations = fieldViolations(err);
    for (const [field, rule] of violations) console.log(`${field}: ${rule}`);
    return args.bad && err.code === grpc.status.INVALID_ARGUMENT && violations.length ? 2 : 1;
  }
  if (args.bad) {
    console.error(`the invalid event was accepted as ${created.event_id}`);
    return 1;
  }
  console.log(`event ${created.event_id} ${created.duplicate ? 'duplicate' : 'created'}`);

  // Read it back until every delivery is final (sent, failed, skipped, canceled).
  const until = Date.now() + WAIT_FINAL_MS;
  let event;
  for (;;) {
    try {
      event = await callWithRetry(ingest, 'GetEvent', checked(notify.GetEventRequest, { event_id: created.event_id }));
    } catch (err) {
      console.error(`GetEvent failed: ${grpc.status[err.code]}: ${err.details}`);
      return 1;
    }
    const pending = event.deliveries.filter((d) => d.status === 'pending' || d.status === 'sending');
    if (!pending.length || Date.now() > until) break;
    await sleep(500);
  }
  for (const d of event.deliveries) {
    const error = d.last_error ? ` last_error=${d.last_error}` : '';
    console.log(`${d.channel} ${d.user_id} ${d.status} attempts=${d.attempts}${error}`);
  }
  for (const s of event.skipped) console.log(`skipped ${s.channel} ${s.user_id} ${s.reason}`);
  ingest.close();
  return 0;
}

process.exitCode = await main();
