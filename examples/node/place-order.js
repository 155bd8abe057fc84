#!/usr/bin/env node
// Places one order against a running checkout orchestrator (`checkout demo`), the way a Node
// service would: the contract is read from proto/checkout/v1/checkout.proto at start (no code
// generation step), the call carries a deadline (sent as `grpc-timeout`) and an `x-client-id`
// (the idempotency scope), and a PENDING answer is polled with GetOrder after its `retry_after`
// — with the same `x-client-id`, since every read is scoped to the caller.
//
// Exits 0 when the order ends CONFIRMED, 1 when it ends any other way, 2 when a call itself
// failed (its gRPC status and message are printed).
//
// Settings (environment):
//   CHECKOUT_ADDR         host:port of the orchestrator      (default 127.0.0.1:50051)
//   CHECKOUT_CLIENT_ID    x-client-id                        (default node-example)
//   CHECKOUT_KEY          idempotency key                    (default node-<epoch ms>)
//   CHECKOUT_DEADLINE_MS  the PlaceOrder deadline, in ms     (default 2000)
//   CHECKOUT_CART         cart id (stub: cart-<N> totals N)  (default cart-1234)
//   CHECKOUT_POLL_FOR_MS  how long to poll a PENDING order   (default 10000)

'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.join(__dirname, '..', '..', 'proto');

const addr = process.env.CHECKOUT_ADDR || '127.0.0.1:50051';
const clientId = process.env.CHECKOUT_CLIENT_ID || 'node-example';
const key = process.env.CHECKOUT_KEY || `node-${Date.now()}`;
const deadlineMs = Number(process.env.CHECKOUT_DEADLINE_MS || 2000);
const cartId = process.env.CHECKOUT_CART || 'cart-1234';
const pollForMs = Number(process.env.CHECKOUT_POLL_FOR_MS || 10000);

// Enums as their names ("ORDER_STATUS_CONFIRMED"), int64 as strings, absent fields as defaults.
const definition = protoLoader.loadSync('checkout/v1/checkout.proto', {
  includeDirs: [PROTO_ROOT],
  keepCase: false,
  enums: String,
  longs: String,
  defaults: true,
  oneofs: true,
});
const { checkout } = grpc.loadPackageDefinition(definition);
const client = new checkout.v1.CheckoutService(addr, grpc.credentials.createInsecure());

// The idempotency scope: every PlaceOrder and GetOrder of this caller carries the same id.
function scoped() {
  const metadata = new grpc.Metadata();
  metadata.set('x-client-id', clientId);
  return metadata;
}

function call(method, request, timeoutMs) {
  return new Promise((resolve, reject) => {
    client[method](request, scoped(), { deadline: Date.now() + timeoutMs }, (error, order) =>
      error ? reject(error) : resolve(order),
    );
  });
}

function millis(duration) {
  if (!duration) return 0;
  return Number(duration.seconds || 0) * 1000 + Math.floor((duration.nanos || 0) / 1e6);
}

function describe(order) {
  const total = order.total ? `${order.total.minorUnits} ${order.total.currency}` : '-';
  return `${order.orderId} ${order.status} ${order.reason || '-'} total=${total}`;
}

async function main() {
  const request = {
    idempotencyKey: key,
    customerId: 'c1',
    cartId,
    walletAccountId: 'a1',
  };
  let order = await call('PlaceOrder', request, deadlineMs);
  console.log(`placed  ${describe(order)} (deadline ${deadlineMs} ms, from ${order.budget.deadlineSource})`);

  // Read it back, as any later caller would: by order id, under the same x-client-id.
  const giveUpAt = Date.now() + pollForMs;
  for (;;) {
    order = await call('GetOrder', { orderId: order.orderId }, 1000);
    console.log(`read    ${describe(order)}`);
    if (order.status !== 'ORDER_STATUS_PENDING' || Date.now() > giveUpAt) break;
    const wait = Math.max(millis(order.retryAfter), 100);
    await new Promise((r) => setTimeout(r, wait));
  }
  return order.status === 'ORDER_STATUS_CONFIRMED' ? 0 : 1;
}

main()
  .then((code) => {
    client.close();
    process.exit(code);
  })
  .catch((error) => {
    // A refusal (INVALID_ARGUMENT, DEADLINE_EXCEEDED for a deadline too short to start,
    // RESOURCE_EXHAUSTED when overloaded, ...) says why in its message; its google.rpc details
    // travel in the `grpc-status-details-bin` trailer.
    console.error(`failed  ${grpc.status[error.code] ?? error.code}: ${error.details}`);
    client.close();
    process.exit(2);
  });
