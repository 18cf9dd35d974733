// User management through the official @medplum/core MedplumClient against a
// real sandbot binary: invite, password login (startLogin + processCode),
// member search in its three forms, and member promotion (POST full update
// and JSON Patch).
//
// Run: cd compat && node --test admin.test.mjs
// The binary is built once into a temp dir with `go build ./cmd/sandbot`
// (or taken from env SANDBOT_BIN); the server runs on the embedded store.
// Helpers are kept in this file on purpose (no shared helper module).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
// On Node, startPkce cannot hash (it looks for window.crypto) and falls back
// to the 'plain' method with a warning (docs/decisions.md, "Login details"); keep the
// test output readable.
const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === 'string' && args[0].startsWith('Failed to hash code verifier')) return;
  warn(...args);
};
const { MedplumClient } = await import('@medplum/core');

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const fetch = globalThis.fetch.bind(globalThis);

function build(dir) {
  if (process.env.SANDBOT_BIN) return Promise.resolve(process.env.SANDBOT_BIN);
  const out = path.join(dir, 'sandbot');
  return new Promise((resolve, reject) =>
    execFile('go', ['build', '-o', out, './cmd/sandbot'], { cwd: repoRoot, maxBuffer: 16 << 20 }, (err, _o, stderr) =>
      err ? reject(new Error(`go build failed: ${stderr}`)) : resolve(out)
    )
  );
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

let tmp;
let child;
let output = '';
let baseUrl;
let clientId;
let clientSecret;

before(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'sandbot-admin-compat-'));
  const bin = await build(tmp);
  const [p1, p2] = [await freePort(), await freePort()];
  baseUrl = `http://127.0.0.1:${p1}/`;
  clientId = randomUUID();
  clientSecret = randomBytes(16).toString('hex');
  const env = {
    ...process.env,
    SANDBOT_ADDR: `127.0.0.1:${p1}`,
    SANDBOT_METRICS_ADDR: `127.0.0.1:${p2}`,
    SANDBOT_BASE_URL: baseUrl,
    SANDBOT_DATA_DIR: path.join(tmp, 'data'),
    SANDBOT_ADMIN_CLIENT_ID: clientId,
    SANDBOT_ADMIN_CLIENT_SECRET: clientSecret,
  };
  delete env.SANDBOT_DATABASE_URL;
  delete env.SANDBOT_SMTP_URL;
  child = spawn(bin, ['serve'], { cwd: tmp, env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout.setEncoding('utf8').on('data', (c) => (output = (output + c).slice(-200_000)));
  child.stderr.setEncoding('utf8').on('data', (c) => (output = (output + c).slice(-200_000)));
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const res = await fetch(baseUrl + 'healthcheck');
      await res.arrayBuffer();
      if (res.status === 200) break;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline || child.exitCode !== null) {
      throw new Error(`server did not start\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
});

after(async () => {
  if (child && child.exitCode === null) {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

function withLogs(fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      err.message += `\n--- last server log lines ---\n${output.split('\n').slice(-20).join('\n')}`;
      throw err;
    }
  };
}

const uniq = () => randomUUID().slice(0, 8);

/** A new project (super admin), with an admin client; returns a MedplumClient logged in as that client. */
async function newProjectAdmin() {
  const su = new MedplumClient({ baseUrl, fetch });
  await su.startClientLogin(clientId, clientSecret);
  const project = await su.post('admin/Project', { resourceType: 'Project', name: `Compat ${uniq()}`, strictMode: true });
  assert.equal(project.resourceType, 'Project');
  const client = await su.post(`admin/projects/${project.id}/client`, { name: 'Compat admin' });
  // Promote the client's membership to admin, as the super admin.
  const ms = await su.searchResources('ProjectMembership', { profile: `ClientApplication/${client.id}` });
  assert.equal(ms.length, 1);
  await su.patch(`admin/projects/${project.id}/members/${ms[0].id}`, [{ op: 'replace', path: '/admin', value: true }]);
  const admin = new MedplumClient({ baseUrl, fetch });
  await admin.startClientLogin(client.id, client.secret);
  return { admin, project };
}

test('invite, then startLogin + processCode as the invited user', withLogs(async () => {
  const { admin, project } = await newProjectAdmin();
  const email = `ada-${uniq()}@example.com`;
  const membership = await admin.invite(project.id, {
    resourceType: 'Practitioner',
    firstName: 'Ada',
    lastName: 'Lovelace',
    email,
    password: 'analytical-engine',
    sendEmail: false,
  });
  assert.equal(membership.resourceType, 'ProjectMembership');
  assert.equal(membership.project.reference, `Project/${project.id}`);
  assert.match(membership.profile.reference, /^Practitioner\//);
  assert.match(membership.user.reference, /^User\//);

  const user = new MedplumClient({ baseUrl, fetch });
  const res = await user.startLogin({ email, password: 'analytical-engine' });
  assert.ok(res.login, 'login id');
  assert.ok(res.code, 'code (one membership)');
  const profile = await user.processCode(res.code);
  assert.equal(profile.resourceType, 'Practitioner');
  assert.equal(`Practitioner/${profile.id}`, membership.profile.reference);
  assert.equal(user.getProject()?.id, project.id);
  // A refresh (refresh_token grant) keeps the session.
  await user.refresh();
  assert.ok(user.isAuthenticated());

  // A wrong password is an error that does not say whether the e-mail exists.
  const other = new MedplumClient({ baseUrl, fetch });
  const e1 = await other.startLogin({ email, password: 'wrong-password' }).catch((e) => e);
  const e2 = await other.startLogin({ email: `nobody-${uniq()}@example.com`, password: 'wrong-password' }).catch((e) => e);
  assert.ok(e1 instanceof Error && e2 instanceof Error);
  assert.equal(e1.message, e2.message);

  // A plain member cannot search memberships.
  await assert.rejects(user.searchResources('ProjectMembership'), /Forbidden/);
}));

test('member search in its three forms, and promotion by POST and PATCH', withLogs(async () => {
  const { admin, project } = await newProjectAdmin();
  const invited = [];
  for (const [rt, n] of [['Patient', 3], ['Practitioner', 2]]) {
    for (let i = 0; i < n; i++) {
      invited.push(
        await admin.invite(project.id, {
          resourceType: rt,
          firstName: rt,
          lastName: String(i),
          email: `${rt.toLowerCase()}${i}-${uniq()}@example.com`,
          sendEmail: false,
        })
      );
    }
  }
  await admin.post(`admin/projects/${project.id}/bot`, { name: 'Compat bot' });

  const humans = await admin.searchResources('ProjectMembership', 'profile-type:not=ClientApplication,Bot');
  assert.equal(humans.length, 5);
  const patients = await admin.searchResources('ProjectMembership', 'profile-type=Patient');
  assert.equal(patients.length, 3);
  const practitioners = await admin.searchResources('ProjectMembership', { 'profile-type': 'Practitioner' });
  assert.equal(practitioners.length, 2);
  const all = await admin.searchResources('ProjectMembership');
  assert.equal(all.length, 7, 'humans + admin client + bot');

  // Promotion, full update: the GET body with admin = true.
  const target = practitioners[0];
  const current = await admin.get(`admin/projects/${project.id}/members/${target.id}`);
  const promoted = await admin.post(`admin/projects/${project.id}/members/${target.id}`, { ...current, admin: true });
  assert.equal(promoted.admin, true);
  assert.equal(promoted.profile.reference, current.profile.reference);
  assert.equal(promoted.user.reference, current.user.reference);

  // Promotion, JSON Patch: replace /admin on a member without the field.
  const second = practitioners[1];
  const patched = await admin.patch(`admin/projects/${project.id}/members/${second.id}`, [
    { op: 'replace', path: '/admin', value: true },
  ]);
  assert.equal(patched.admin, true);
  const admins = await admin.searchResources('ProjectMembership', { admin: 'true', 'profile-type': 'Practitioner' });
  assert.equal(admins.length, 2);

  // Paths other than the membership's own fields are refused.
  await assert.rejects(
    admin.patch(`admin/projects/${project.id}/members/${second.id}`, [{ op: 'replace', path: '/project', value: {} }]),
    /\/project/
  );
}));
