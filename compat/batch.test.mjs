// Batch and transaction Bundles through the official @medplum/core client:
// executeBatch, and the auto-batching of reads that the reference's web app
// turns on (autoBatchTime 100 ms): reads made together go out as one batch.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient } = await import('@medplum/core');

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

test('auto-batching: reads within autoBatchTime go out as one batch Bundle', async () => {
  const sent = [];
  const recording = (url, init) => {
    sent.push(`${init?.method ?? 'GET'} ${new URL(url).pathname}`);
    return fetch(url, init);
  };
  const medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch: recording, autoBatchTime: 100 });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
  const family = `Auto${randomUUID().slice(0, 8)}`;
  const created = [];
  for (let i = 0; i < 3; i++) created.push(await medplum.createResource({ resourceType: 'Patient', name: [{ family }] }));
  sent.length = 0;
  const [a, b, c, found] = await Promise.all([
    medplum.readResource('Patient', created[0].id),
    medplum.readResource('Patient', created[1].id),
    medplum.readResource('Patient', created[2].id),
    medplum.searchResources('Patient', { family }),
  ]);
  assert.deepEqual([a.id, b.id, c.id], created.map((p) => p.id));
  assert.equal(found.length, 3);
  assert.deepEqual(sent, ['POST /fhir/R4'], 'one batch request');
  // A failing read in the batch rejects only its own promise.
  const [missing, ok] = await Promise.allSettled([
    medplum.readResource('Patient', randomUUID()),
    medplum.readResource('Observation', randomUUID()).catch(() => 'other'),
  ]);
  assert.equal(missing.status, 'rejected');
  assert.match(String(missing.reason), /Not found/);
  assert.equal(ok.value, 'other');
});

test('executeBatch: a transaction with urn:uuid references', async () => {
  const medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
  const urn = `urn:uuid:${randomUUID()}`;
  const result = await medplum.executeBatch({
    resourceType: 'Bundle',
    type: 'transaction',
    entry: [
      {
        request: { method: 'POST', url: 'Observation' },
        resource: { resourceType: 'Observation', status: 'final', code: { text: 'x' }, subject: { reference: urn } },
      },
      { fullUrl: urn, request: { method: 'POST', url: 'Patient' }, resource: { resourceType: 'Patient' } },
    ],
  });
  assert.equal(result.type, 'transaction-response');
  assert.equal(result.entry[0].response.status, '201');
  assert.equal(result.entry[0].resource.subject.reference, `Patient/${result.entry[1].resource.id}`);
  await assert.rejects(
    medplum.executeBatch({ resourceType: 'Bundle', type: 'transaction', entry: [{ request: { method: 'GET', url: `Patient/${randomUUID()}` } }] }),
    /Bundle.entry\[0\]/
  );
});
