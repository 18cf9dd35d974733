// _include, _revinclude and _has through the official @medplum/core client:
// the included resources are entries of mode include, after the matches.
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

test('search with _include and _revinclude', async () => {
  const patient = await medplum.createResource({ resourceType: 'Patient', name: [{ family: 'Include' }] });
  const obs = await medplum.createResource({
    resourceType: 'Observation',
    status: 'final',
    code: { text: 'heart rate' },
    subject: { reference: `Patient/${patient.id}` },
  });

  const bundle = await medplum.search('Observation', { _id: obs.id, _include: 'Observation:subject' }, { cache: 'no-cache' });
  const modes = bundle.entry.map((e) => `${e.search.mode} ${e.resource.resourceType}/${e.resource.id}`).sort();
  assert.deepEqual(modes, [`include Patient/${patient.id}`, `match Observation/${obs.id}`]);

  // searchResources answers every entry's resource, the Bundle beside.
  const all = await medplum.searchResources('Patient', { _id: patient.id, _revinclude: 'Observation:subject' }, { cache: 'no-cache' });
  assert.deepEqual(all.map((r) => r.id), [patient.id, obs.id]);
  assert.deepEqual(all.bundle.entry.map((e) => e.search.mode), ['match', 'include']);

  // _has: the Patients that such an Observation refers to.
  const found = await medplum.searchResources('Patient', { '_has:Observation:subject:code:above': 'x' }).catch((e) => e);
  assert.equal(found.outcome?.issue?.[0]?.code, 'invalid', 'an unsupported modifier is refused (400), never ignored');
  const has = await medplum.searchResources('Patient', { '_has:Observation:subject:_id': obs.id }, { cache: 'no-cache' });
  assert.deepEqual(has.map((r) => r.id), [patient.id]);
});
