// Asynchronous bot executions through the official @medplum/core client:
// executeBot with Prefer: respond-async, followed by the client's own
// polling of the job status (pollStatusOnAccepted, as startAsyncRequest
// callers use it), and by hand from the accepted outcome's status URL.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient, ContentType } = await import('@medplum/core');

const here = path.dirname(fileURLToPath(import.meta.url));
let server;
let medplum;
let echo; // the C echo bot: text in, the same text out
let hello; // the Go hello bot: {"name"} in, {"greeting"} out

before(async () => {
  server = await startServer();
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
  const me = await medplum.get('auth/me');
  for (const [name, file] of [['echo', 'c-echo/c-echo.wasm'], ['hello', 'hello/hello.wasm']]) {
    const bot = await medplum.post(`admin/projects/${me.project.id}/bot`, { name });
    const wasm = await readFile(path.join(here, '..', 'examples', file));
    await medplum.post(medplum.fhirUrl('Bot', bot.id, '$deploy'), wasm, 'application/wasm');
    if (name === 'echo') echo = bot.id;
    else hello = bot.id;
  }
});

after(async () => {
  await server?.stop();
});

const param = (job, name) => job.output?.parameter?.find((p) => p.name === name);

test('executeBot with Prefer: respond-async and pollStatusOnAccepted resolves to the completed AsyncJob', async () => {
  const job = await medplum.executeBot(echo, 'hello, later', ContentType.TEXT, {
    headers: { Prefer: 'respond-async' },
    pollStatusOnAccepted: true,
    pollStatusPeriod: 50,
  });
  assert.equal(job.resourceType, 'AsyncJob');
  assert.equal(job.status, 'completed');
  assert.match(job.request, new RegExp(`/fhir/R4/Bot/${echo}/\\$execute$`));
  assert.equal(param(job, 'responseBody')?.valueString, 'hello, later');

  const greeting = await medplum.executeBot(hello, { name: 'Ada' }, ContentType.JSON, {
    headers: { Prefer: 'respond-async' },
    pollStatusOnAccepted: true,
    pollStatusPeriod: 50,
  });
  assert.deepEqual(JSON.parse(param(greeting, 'responseBody').valueString), { greeting: 'Hello, Ada' });
});

test('startAsyncRequest then polling the status URL by hand', async () => {
  // Without pollStatusOnAccepted the client answers the accepted outcome,
  // whose diagnostics are the status URL (also the Content-Location).
  const accepted = await medplum.startAsyncRequest(medplum.fhirUrl('Bot', echo, '$execute').toString(), {
    body: 'by hand',
    headers: { 'Content-Type': ContentType.TEXT },
  });
  assert.equal(accepted.resourceType, 'OperationOutcome');
  assert.equal(accepted.id, 'accepted');
  const statusUrl = accepted.issue[0].diagnostics;
  assert.match(statusUrl, /\/fhir\/R4\/job\/[\w-]+\/status$/);
  let job;
  for (let i = 0; i < 600; i++) {
    job = await medplum.get(statusUrl, { cache: 'no-cache' });
    if (!['accepted', 'active'].includes(job.status)) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(job.status, 'completed');
  assert.equal(param(job, 'responseBody')?.valueString, 'by hand');
  // A job that ended cannot be cancelled.
  await assert.rejects(medplum.delete(statusUrl), /cannot be cancelled/);
});

test('a failing bot completes its job with the failure as the outcome', async () => {
  const job = await medplum.executeBot(hello, 'not json', ContentType.TEXT, {
    headers: { Prefer: 'respond-async' },
    pollStatusOnAccepted: true,
    pollStatusPeriod: 50,
  });
  assert.equal(job.status, 'completed');
  const outcome = param(job, 'outcome')?.resource;
  assert.equal(outcome?.resourceType, 'OperationOutcome');
  assert.match(outcome.issue[0].details.text, /expected a JSON object/);
});
