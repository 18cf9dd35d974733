// Platform compatibility: the official @medplum/core MedplumClient against a
// real sandbot server (built and started by ./server.mjs).
//
// Run: cd compat && node --test platform.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time, which
// Node 20 only has behind --experimental-websocket; a stub is enough here.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient, OperationOutcomeError } = await import('@medplum/core');

const fetch = globalThis.fetch.bind(globalThis);

let srv;
let medplum; // logged in with client credentials (Bearer)

before(async () => {
  srv = await startServer();
  medplum = new MedplumClient({ baseUrl: srv.baseUrl, fetch });
});

after(async () => {
  if (!srv) return;
  const { code } = await srv.stop(); // rejects when the exit code is not 0
  assert.equal(code, 0, 'server exit code after SIGTERM');
});

/** Runs fn, which must reject with an OperationOutcomeError; returns the error. */
async function rejectsWithOutcome(fn, what) {
  let err;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  assert.ok(err, `${what}: expected a rejection`);
  assert.ok(err instanceof OperationOutcomeError, `${what}: expected OperationOutcomeError, got ${err}`);
  assert.equal(err.outcome?.resourceType, 'OperationOutcome', `${what}: err.outcome`);
  return err;
}

/** Dumps server logs when an assertion fails, to make failures self-explaining. */
function withLogs(fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const tail = srv?.logs().split('\n').slice(-20).join('\n');
      err.message += `\n--- last server log lines ---\n${tail}`;
      throw err;
    }
  };
}

test('startClientLogin resolves and getProfile() is the ClientApplication', withLogs(async () => {
  const profile = await medplum.startClientLogin(srv.clientId, srv.clientSecret);
  assert.ok(profile, 'startClientLogin resolved to a profile');
  assert.equal(profile.resourceType, 'ClientApplication');
  assert.equal(profile.id, srv.clientId);
  const p = medplum.getProfile();
  assert.equal(p?.resourceType, 'ClientApplication');
  assert.equal(p?.id, srv.clientId);
  assert.ok(medplum.getAccessToken(), 'access token stored');
  assert.ok(medplum.isAuthenticated(), 'client is authenticated');
  assert.ok(medplum.getProject()?.id, 'project from /auth/me');
}));

test('create, read, update, patch a Patient', withLogs(async () => {
  const created = await medplum.createResource({
    resourceType: 'Patient',
    name: [{ family: 'Crudson', given: ['Ada'] }],
    birthDate: '1990-01-02',
  });
  assert.equal(created.resourceType, 'Patient');
  assert.ok(created.id, 'id assigned');
  assert.ok(created.meta?.versionId, 'meta.versionId present');
  assert.ok(created.meta?.lastUpdated, 'meta.lastUpdated present');

  const read = await medplum.readResource('Patient', created.id);
  assert.equal(read.id, created.id);
  assert.equal(read.meta.versionId, created.meta.versionId);
  assert.deepEqual(read.name, created.name);
  assert.equal(read.birthDate, '1990-01-02');

  const updated = await medplum.updateResource({ ...read, gender: 'female' });
  assert.equal(updated.id, created.id);
  assert.equal(updated.gender, 'female');
  assert.ok(updated.meta?.versionId);
  assert.notEqual(updated.meta.versionId, created.meta.versionId, 'versionId changes on update');

  const reread = await medplum.readResource('Patient', created.id);
  assert.equal(reread.gender, 'female');
  assert.equal(reread.meta.versionId, updated.meta.versionId);

  const patched = await medplum.patchResource('Patient', created.id, [
    { op: 'replace', path: '/gender', value: 'other' },
    { op: 'add', path: '/active', value: true },
    { op: 'replace', path: '/name/0/given/0', value: 'Adele' },
  ]);
  assert.equal(patched.id, created.id);
  assert.equal(patched.gender, 'other');
  assert.equal(patched.active, true);
  assert.equal(patched.name[0].given[0], 'Adele');
  assert.notEqual(patched.meta.versionId, updated.meta.versionId, 'versionId changes on patch');

  const afterPatch = await medplum.readResource('Patient', created.id);
  assert.equal(afterPatch.gender, 'other');
  assert.equal(afterPatch.active, true);
  assert.equal(afterPatch.name[0].given[0], 'Adele');
}));

test('searchResources by name (object and string queries)', withLogs(async () => {
  const family = `Searchy${randomUUID().slice(0, 8)}`;
  const a = await medplum.createResource({ resourceType: 'Patient', name: [{ family, given: ['One'] }] });
  const b = await medplum.createResource({ resourceType: 'Patient', name: [{ family: family + 'son', given: ['Two'] }] });
  await medplum.createResource({ resourceType: 'Patient', name: [{ family: 'Unrelated', given: ['Three'] }] });

  // name is a string search: prefix, case-insensitive.
  const byObject = await medplum.searchResources('Patient', { name: family.toLowerCase() });
  assert.deepEqual(byObject.map((p) => p.id).sort(), [a.id, b.id].sort());
  assert.ok(byObject.bundle, 'ResourceArray carries the Bundle');
  assert.equal(byObject.bundle.resourceType, 'Bundle');
  assert.equal(byObject.bundle.type, 'searchset');

  // String query with a modifier: sent as ?name%3Aexact=<family>.
  const exact = await medplum.searchResources('Patient', `name:exact=${family}`);
  assert.deepEqual(exact.map((p) => p.id), [a.id]);

  const exactLower = await medplum.searchResources('Patient', `name:exact=${family.toLowerCase()}`);
  assert.equal(exactLower.length, 0, ':exact is case-sensitive');

  // URLSearchParams query.
  const viaParams = await medplum.searchResources('Patient', new URLSearchParams({ name: family, _count: '10' }));
  assert.equal(viaParams.length, 2);

  // searchOne returns the single match.
  const one = await medplum.searchOne('Patient', `name:exact=${family}`);
  assert.equal(one?.id, a.id);
}));

test('search paging with _count follows the Bundle next link', withLogs(async () => {
  const family = `Pager${randomUUID().slice(0, 8)}`;
  const ids = new Set();
  for (let i = 0; i < 7; i++) {
    const p = await medplum.createResource({ resourceType: 'Patient', name: [{ family, given: [`P${i}`] }] });
    ids.add(p.id);
  }

  let bundle = await medplum.search('Patient', { name: family, _count: 3 });
  assert.equal(bundle.resourceType, 'Bundle');
  const seen = [];
  const pageSizes = [];
  for (let page = 0; page < 10; page++) {
    const entries = bundle.entry ?? [];
    assert.ok(entries.length <= 3, `page ${page} has at most _count entries (got ${entries.length})`);
    pageSizes.push(entries.length);
    seen.push(...entries.map((e) => e.resource.id));
    const next = bundle.link?.find((l) => l.relation === 'next')?.url;
    if (!next) break;
    bundle = await medplum.get(next);
    assert.equal(bundle.resourceType, 'Bundle');
  }
  assert.equal(seen.length, 7, `saw ${seen.length} entries over pages ${JSON.stringify(pageSizes)}`);
  assert.equal(new Set(seen).size, 7, 'no entry repeated across pages');
  assert.deepEqual(new Set(seen), ids);
  assert.deepEqual(pageSizes, [3, 3, 1]);
}));

test('deleteResource, then readResource rejects with 410 deleted', withLogs(async () => {
  const p = await medplum.createResource({ resourceType: 'Patient', name: [{ family: 'Gone' }] });
  await medplum.deleteResource('Patient', p.id);
  const err = await rejectsWithOutcome(() => medplum.readResource('Patient', p.id), 'read after delete');
  assert.equal(err.outcome.issue?.[0]?.code, 'deleted', JSON.stringify(err.outcome));
}));

test('reading a random id rejects with not-found', withLogs(async () => {
  const err = await rejectsWithOutcome(() => medplum.readResource('Patient', randomUUID()), 'read random id');
  assert.equal(err.outcome.issue?.[0]?.code, 'not-found', JSON.stringify(err.outcome));
}));

test('setBasicAuth on a fresh client, then readResource works with Basic auth', withLogs(async () => {
  const p = await medplum.createResource({ resourceType: 'Patient', name: [{ family: 'Basic' }] });

  const seen = [];
  const recordingFetch = async (url, init) => {
    const h = new Headers(init?.headers);
    seen.push({ url: String(url), authorization: h.get('authorization') });
    return fetch(url, init);
  };
  const basic = new MedplumClient({ baseUrl: srv.baseUrl, fetch: recordingFetch });
  basic.setBasicAuth(srv.clientId, srv.clientSecret);
  const read = await basic.readResource('Patient', p.id);
  assert.equal(read.id, p.id);
  assert.equal(read.name[0].family, 'Basic');
  // Served with Basic directly, without falling back to a token request.
  assert.deepEqual(
    seen.map((s) => [new URL(s.url).pathname, s.authorization?.split(' ')[0]]),
    [[`/fhir/R4/Patient/${p.id}`, 'Basic']]
  );

  // Writes work with Basic auth too.
  const c = await basic.createResource({ resourceType: 'Patient', name: [{ family: 'BasicWrite' }] });
  assert.ok(c.id);
}));

test('startClientLogin with a wrong secret rejects', withLogs(async () => {
  const bad = new MedplumClient({ baseUrl: srv.baseUrl, fetch });
  await assert.rejects(() => bad.startClientLogin(srv.clientId, 'wrong-secret-0123456789abcdef'));
  assert.equal(bad.getProfile(), undefined);
  assert.equal(bad.isAuthenticated(), false);

  const unknown = new MedplumClient({ baseUrl: srv.baseUrl, fetch });
  await assert.rejects(() => unknown.startClientLogin(randomUUID(), srv.clientSecret));
}));

test('wrong Basic credentials are rejected', withLogs(async () => {
  const bad = new MedplumClient({ baseUrl: srv.baseUrl, fetch });
  bad.setBasicAuth(srv.clientId, 'wrong-secret-0123456789abcdef');
  await assert.rejects(() => bad.readResource('Patient', randomUUID()));
}));

test('wire details the client relies on: token response, 201/ETag/Location, 410, 404', withLogs(async () => {
  const tokenRes = await fetch(new URL('oauth2/token', srv.baseUrl), {
    method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      grant_type: 'client_credentials',
      client_id: srv.clientId,
      client_secret: srv.clientSecret,
    }),
  });
  assert.equal(tokenRes.status, 200);
  const tok = await tokenRes.json();
  assert.equal(tok.token_type, 'Bearer');
  assert.equal(tok.profile?.reference, `ClientApplication/${srv.clientId}`);
  assert.match(tok.project?.reference ?? '', /^Project\//);
  assert.equal(tok.refresh_token, undefined, 'no refresh token for client_credentials');
  const claims = JSON.parse(Buffer.from(tok.access_token.split('.')[1], 'base64url').toString());
  assert.equal(claims.client_id, srv.clientId, 'JWT client_id claim (checked by verifyTokens)');
  assert.equal(typeof claims.login_id, 'string', 'JWT login_id claim (makes the client call /auth/me)');
  assert.ok(claims.exp * 1000 > Date.now());

  const headers = {
    Authorization: `Bearer ${tok.access_token}`,
    Accept: 'application/fhir+json, */*; q=0.1',
    'Content-Type': 'application/fhir+json',
    'X-Medplum': 'extended',
  };
  const create = await fetch(new URL('fhir/R4/Patient', srv.baseUrl), {
    method: 'POST',
    headers,
    body: JSON.stringify({ resourceType: 'Patient', name: [{ family: 'Wire' }] }),
  });
  assert.equal(create.status, 201);
  const p = await create.json();
  assert.equal(create.headers.get('etag'), `W/"${p.meta.versionId}"`);
  assert.match(create.headers.get('location') ?? '', new RegExp(`Patient/${p.id}`));
  assert.match(create.headers.get('content-type') ?? '', /json/);

  const del = await fetch(new URL(`fhir/R4/Patient/${p.id}`, srv.baseUrl), { method: 'DELETE', headers });
  assert.ok(del.status === 200 || del.status === 204, `delete status ${del.status}`);
  await del.arrayBuffer();
  const gone = await fetch(new URL(`fhir/R4/Patient/${p.id}`, srv.baseUrl), { headers });
  assert.equal(gone.status, 410);
  assert.equal((await gone.json()).issue[0].code, 'deleted');
  const missing = await fetch(new URL(`fhir/R4/Patient/${randomUUID()}`, srv.baseUrl), { headers });
  assert.equal(missing.status, 404);
  assert.equal((await missing.json()).issue[0].code, 'not-found');
}));
