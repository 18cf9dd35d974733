// Conditional create and update through the official @medplum/core client:
// createResourceIfNoneExist (POST with If-None-Exist) and upsertResource
// (PUT <Type>?<query>), as the client sends them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient } = await import('@medplum/core');

let server;
let medplum;
const sent = [];

before(async () => {
  server = await startServer();
  const recording = (url, init) => {
    const headers = new Headers(init?.headers);
    sent.push(`${init?.method ?? 'GET'} ${decodeURIComponent(new URL(url).pathname + new URL(url).search)} ${headers.get('if-none-exist') ?? ''}`.trim());
    return fetch(url, init);
  };
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch: recording, cacheTime: 0 });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
});

after(async () => {
  await server?.stop();
});

test('createResourceIfNoneExist: creates once, then answers the existing resource', async () => {
  const system = `urn:compat:${randomUUID()}`;
  const patient = { resourceType: 'Patient', identifier: [{ system, value: '1' }], gender: 'female' };
  sent.length = 0;
  const first = await medplum.createResourceIfNoneExist(patient, `identifier=${system}|1`);
  const second = await medplum.createResourceIfNoneExist({ ...patient, gender: 'male' }, `identifier=${system}|1`);
  assert.deepEqual(sent, [
    `POST /fhir/R4/Patient identifier=${system}|1`,
    `POST /fhir/R4/Patient identifier=${system}|1`,
  ]);
  assert.ok(first.id);
  assert.equal(second.id, first.id);
  assert.equal(second.meta.versionId, first.meta.versionId, 'the existing resource, not a new version');
  assert.equal(second.gender, 'female');
  const found = await medplum.searchResources('Patient', { identifier: `${system}|1` });
  assert.equal(found.length, 1);

  // Two matches: 412 multiple-matches, thrown as an OperationOutcomeError.
  await medplum.createResource(patient);
  await assert.rejects(medplum.createResourceIfNoneExist(patient, `identifier=${system}|1`), /Multiple resources found matching condition/);
  // An unknown search parameter: 400, not a create.
  await assert.rejects(medplum.createResourceIfNoneExist(patient, 'nonsense=1'), /Unknown search parameter: nonsense/);
});

test('upsertResource: creates when nothing matches, then updates the match', async () => {
  const system = `urn:compat:${randomUUID()}`;
  const patient = { resourceType: 'Patient', identifier: [{ system, value: '1' }] };
  sent.length = 0;
  const created = await medplum.upsertResource({ ...patient, gender: 'female' }, `identifier=${system}|1`);
  const updated = await medplum.upsertResource({ ...patient, gender: 'male' }, { identifier: `${system}|1` });
  assert.deepEqual(sent, [`PUT /fhir/R4/Patient?identifier=${system}|1`, `PUT /fhir/R4/Patient?identifier=${system}|1`]);
  assert.ok(created.id);
  assert.equal(updated.id, created.id);
  assert.equal(updated.gender, 'male');
  assert.notEqual(updated.meta.versionId, created.meta.versionId);
  const history = await medplum.readHistory('Patient', created.id);
  assert.equal(history.entry.length, 2);

  await medplum.createResource(patient);
  await assert.rejects(medplum.upsertResource({ ...patient, gender: 'other' }, `identifier=${system}|1`), /Multiple resources found matching condition/);
  // A body id that is not the match's.
  const other = `urn:compat:${randomUUID()}`;
  const one = await medplum.createResource({ resourceType: 'Patient', identifier: [{ system: other, value: '1' }] });
  await assert.rejects(
    medplum.upsertResource({ resourceType: 'Patient', id: randomUUID() }, `identifier=${other}|1`),
    /Resource ID did not match resolved ID/
  );
  assert.equal((await medplum.readResource('Patient', one.id)).meta.versionId, one.meta.versionId);
});
