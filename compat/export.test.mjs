// Bulk Data export through the official @medplum/core client: bulkExport
// posts $export with Prefer: respond-async, polls the status URL, and
// answers the manifest, whose NDJSON files the client then reads.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient } = await import('@medplum/core');

let server;
let medplum;

before(async () => {
  server = await startServer();
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
});

after(async () => {
  await server?.stop();
});

test('bulkExport answers a manifest of NDJSON files', async () => {
  const patient = await medplum.createResource({ resourceType: 'Patient', name: [{ family: 'Export' }] });
  await medplum.createResource({ resourceType: 'Observation', status: 'final', code: { text: 'bp' }, subject: { reference: `Patient/${patient.id}` } });
  const manifest = await medplum.bulkExport('', 'Patient,Observation', undefined, { pollStatusOnAccepted: true, pollStatusPeriod: 50 });
  assert.equal(manifest.requiresAccessToken, true);
  const types = manifest.output.map((o) => o.type).sort();
  assert.deepEqual(types, ['Observation', 'Patient']);
  for (const o of manifest.output) {
    const text = await medplum.download(o.url).then((blob) => blob.text());
    const lines = text.trim().split('\n').map((l) => JSON.parse(l));
    assert.ok(lines.length >= 1);
    assert.ok(lines.every((r) => r.resourceType === o.type));
  }
  const group = await medplum.createResource({ resourceType: 'Group', type: 'person', actual: true, member: [{ entity: { reference: `Patient/${patient.id}` } }] });
  const byGroup = await medplum.bulkExport(`Group/${group.id}`, 'Patient', undefined, { pollStatusOnAccepted: true, pollStatusPeriod: 50 });
  assert.deepEqual(byGroup.output.map((o) => o.type), ['Patient']);
});
