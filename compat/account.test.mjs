// The calls the reference's web app makes on its sign-in, security and
// password pages and its Bot page's Deploy button, through the official
// @medplum/core MedplumClient against the real binary: auth/method, auth/me's
// config and security, auth/changepassword, auth/revoke, signOut
// (oauth2/logout), and $deploy with no body.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
// On Node, startPkce falls back to 'plain' with a warning; keep the output readable.
const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === 'string' && args[0].startsWith('Failed to hash code verifier')) return;
  warn(...args);
};
const { MedplumClient } = await import('@medplum/core');

const here = path.dirname(fileURLToPath(import.meta.url));
let server;
let project;
let su;

before(async () => {
  server = await startServer();
  su = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await su.startClientLogin(server.clientId, server.clientSecret);
  project = await su.post('admin/Project', { resourceType: 'Project', name: `Account ${randomUUID().slice(0, 8)}`, strictMode: true });
});

after(async () => {
  await server?.stop();
});

async function invite(admin) {
  const email = `u-${randomUUID().slice(0, 8)}@example.com`;
  await su.post(`admin/projects/${project.id}/invite`, {
    resourceType: 'Practitioner', firstName: 'Ada', lastName: 'Account', email, password: 'first-password', sendEmail: false, admin,
  });
  return email;
}

async function signIn(email, password) {
  const medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  assert.deepEqual(await medplum.post('auth/method', { email }), {});
  const res = await medplum.startLogin({ email, password });
  await medplum.processCode(res.code);
  return medplum;
}

test('auth/me has the menu and the sessions; changepassword; revoke; signOut', async () => {
  const email = await invite(true);
  const medplum = await signIn(email, 'first-password');
  const me = await medplum.get('auth/me', { cache: 'no-cache' });
  assert.deepEqual(me.config.menu.map((m) => m.title), ['Favorites', 'Admin']);
  assert.ok(me.config.menu[0].link.some((l) => l.target === '/Patient'));
  assert.equal(me.security.mfaEnrolled, false);
  assert.ok(me.security.sessions.length >= 1);
  assert.deepEqual(medplum.getUserConfiguration()?.menu?.map((m) => m.title), ['Favorites', 'Admin']);

  await assert.rejects(medplum.post('auth/changepassword', { oldPassword: 'wrong-one', newPassword: 'second-password' }), /Incorrect password/);
  await medplum.post('auth/changepassword', { oldPassword: 'first-password', newPassword: 'second-password', confirmPassword: 'second-password' });
  const second = await signIn(email, 'second-password');

  // Revoke the second session from the first, as the Security page does.
  const token2 = second.getAccessToken();
  const sessions = (await medplum.get('auth/me', { cache: 'no-cache' })).security.sessions;
  const other = sessions.find((s) => token2.includes('.') && JSON.parse(Buffer.from(token2.split('.')[1], 'base64url')).login_id === s.id);
  assert.ok(other, 'the second sign-in is listed');
  await medplum.post('auth/revoke', { loginId: other.id });
  const r = await fetch(server.baseUrl + 'auth/me', { headers: { Authorization: `Bearer ${token2}` } });
  assert.equal(r.status, 401);

  // signOut revokes the login behind the token.
  const token1 = medplum.getAccessToken();
  await medplum.signOut();
  const r2 = await fetch(server.baseUrl + 'auth/me', { headers: { Authorization: `Bearer ${token1}` } });
  assert.equal(r2.status, 401);
});

test('features sandbot lacks answer a 400 OperationOutcome the client shows', async () => {
  const medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await assert.rejects(medplum.startNewUser({ firstName: 'A', lastName: 'B', email: 'new@example.com', password: 'a-password', recaptchaToken: '' }),
    /Registration is not open/);
  await assert.rejects(medplum.startGoogleLogin({ googleCredential: 'x' }), /Google sign-in is not supported/);
});

test('$deploy with no body redeploys the stored module (the Bot page\'s Deploy button)', async () => {
  const admin = await signIn(await invite(true), 'first-password');
  const bot = await su.post(`admin/projects/${project.id}/bot`, { name: 'deploy-button' });
  const wasm = await readFile(path.join(here, '..', 'examples', 'c-echo', 'c-echo.wasm'));
  await admin.post(admin.fhirUrl('Bot', bot.id, '$deploy'), wasm, 'application/wasm');
  const outcome = await admin.post(admin.fhirUrl('Bot', bot.id, '$deploy'));
  assert.equal(outcome.resourceType, 'OperationOutcome');
  assert.equal(outcome.issue[0].code, 'informational');
  assert.equal(await admin.executeBot(bot.id, 'hello', 'text/plain'), 'hello');
});
