// Subscriptions through the official @medplum/core client: a Subscription
// created with createResource runs a JavaScript bot on the writes its
// criteria match (the bot's own write is the effect observed), and one
// whose endpoint is a URL posts to an HTTP hook, signed with its secret.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient } = await import('@medplum/core');

let server;
let medplum;
let hook;
const received = [];

before(async () => {
  hook = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      received.push({ headers: req.headers, body });
      res.writeHead(200).end();
    });
  });
  await new Promise((resolve) => hook.listen(0, '127.0.0.1', resolve));
  // The hook listens on loopback, which the server refuses unless allowed.
  server = await startServer({ env: { SANDBOT_WEBHOOK_ALLOW: '127.0.0.1' } });
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
});

after(async () => {
  await server?.stop();
  hook?.close();
});

const until = async (fn, what) => {
  for (let i = 0; i < 400; i++) {
    const v = await fn();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`timed out waiting for ${what}`);
};

test('createResource(Subscription) to a Bot: a matching write runs the bot', async () => {
  const me = await medplum.get('auth/me');
  const bot = await medplum.post(`admin/projects/${me.project.id}/bot`, { name: 'greeter', runtimeVersion: 'vmcontext' });
  await medplum.post(medplum.fhirUrl('Bot', bot.id, '$deploy'), {
    filename: 'greeter.js',
    code: `exports.handler = async (medplum, event) => {
  const patient = event.input;
  await medplum.createResource({ resourceType: 'Communication', status: 'completed',
    subject: { reference: 'Patient/' + patient.id }, payload: [{ contentString: 'Welcome, ' + patient.name[0].given[0] }] });
  return true;
};`,
  });
  const sub = await medplum.createResource({
    resourceType: 'Subscription',
    status: 'active',
    reason: 'welcome new patients',
    criteria: 'Patient?family=Lovelace',
    channel: { type: 'rest-hook', endpoint: `Bot/${bot.id}` },
  });
  assert.equal(sub.status, 'active');

  const other = await medplum.createResource({ resourceType: 'Patient', name: [{ given: ['Alan'], family: 'Turing' }] });
  const ada = await medplum.createResource({ resourceType: 'Patient', name: [{ given: ['Ada'], family: 'Lovelace' }] });
  const sent = await until(
    async () => (await medplum.searchResources('Communication', { subject: `Patient/${ada.id}` }, { cache: 'no-cache' }))[0],
    "the bot's Communication"
  );
  assert.equal(sent.payload[0].contentString, 'Welcome, Ada');
  const none = await medplum.searchResources('Communication', { subject: `Patient/${other.id}` }, { cache: 'no-cache' });
  assert.equal(none.length, 0, 'a Patient the criteria does not match ran the bot');

  // The execution's AuditEvent names the Subscription.
  const events = await until(
    async () => {
      const found = await medplum.searchResources('AuditEvent', { entity: `Subscription/${sub.id}` }, { cache: 'no-cache' });
      return found.length ? found : undefined;
    },
    'the AuditEvent'
  );
  assert.equal(events[0].outcome, '0');
});

test('createResource(Subscription) to a URL: the hook receives the resource, signed', async () => {
  const secret = 'compat-secret';
  const sub = await medplum.createResource({
    resourceType: 'Subscription',
    status: 'active',
    reason: 'hook',
    criteria: 'Observation',
    channel: { type: 'rest-hook', endpoint: `http://127.0.0.1:${hook.address().port}/hook`, header: ['X-Team: compat'] },
    extension: [{ url: 'https://medplum.com/fhir/StructureDefinition/subscription-secret', valueString: secret }],
  });
  const obs = await medplum.createResource({ resourceType: 'Observation', status: 'final', code: { text: 'weight' } });
  const call = await until(() => received.find((r) => r.body.includes(obs.id)), 'the hook call');
  assert.equal(call.headers['x-medplum-subscription'], sub.id);
  assert.equal(call.headers['x-medplum-interaction'], 'create');
  assert.equal(call.headers['x-team'], 'compat');
  assert.equal(call.headers['x-signature'], createHmac('sha256', secret).update(call.body).digest('hex'));
  assert.equal(JSON.parse(call.body).id, obs.id);
});
