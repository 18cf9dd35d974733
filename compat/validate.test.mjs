// Validation through the official @medplum/core client: validateResource
// ($validate) answers the issues without writing, and createResource of an
// invalid resource is refused with the element named (issue 19).
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
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch, cacheTime: 0 });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
});

after(async () => {
  await server?.stop();
});

test('validateResource: All OK for a valid Patient, the element for an invalid one', async () => {
  const ok = await medplum.validateResource({ resourceType: 'Patient', name: [{ given: ['Ada'] }], birthDate: '1815-12-10' });
  assert.equal(ok.resourceType, 'OperationOutcome');
  assert.equal(ok.issue[0].severity, 'information');
  const bad = await medplum.validateResource({ resourceType: 'Patient', gender: 5, birthDate: 'not-a-date' });
  assert.deepEqual(bad.issue.map((i) => i.expression[0]), ['Patient.birthDate', 'Patient.gender']);
  assert.ok(bad.issue.every((i) => i.severity === 'error'));
});

test('createResource of an invalid Patient is refused naming the element', async () => {
  await assert.rejects(medplum.createResource({ resourceType: 'Patient', name: 'Ada' }), (err) => {
    assert.equal(err.outcome?.issue?.[0]?.expression?.[0], 'Patient.name');
    return true;
  });
  const found = await medplum.searchResources('Patient', { _count: 100 });
  assert.ok(found.every((p) => typeof p.name !== 'string'));
});
