// The browser test: a page built from the reference platform's published
// React components (app/main.jsx: SignInForm, SearchControl, ResourceTable,
// ResourceForm, ResourceHistoryTable, with the client's autoBatchTime at
// 100 ms as the reference's web app sets it), served on its own origin, in
// Debian's Chromium driven by puppeteer-core, against the real sandbot binary
// (../server.mjs) on the embedded store and, when PostgreSQL answers
// (SANDBOT_TEST_DATABASE_URL, as make test sets it in CI), on PostgreSQL.
//
// Steps: sign in with a password; search Patients and Bots; open a record;
// create and edit a Patient through the form; see its history. The
// components load type definitions through FHIR GraphQL ($graphql) and, with
// autoBatchTime, send reads made together as batch Bundles (POST /fhir/R4).
//
// Chromium: CHROMIUM (default /usr/bin/chromium). Without it the test is
// skipped, except in CI (CI=true), where it fails. Screenshots of failed
// steps go to compat/web/test-output/.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';
import { startServer, freePort } from '../server.mjs';
import { buildPage } from './build.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
const inCI = process.env.CI === 'true';
const haveChromium = existsSync(chromium);
if (!haveChromium && inCI) throw new Error(`Chromium not found at ${chromium}: .ci/run installs Debian's chromium`);
const skipAll = haveChromium ? false : `no Chromium at ${chromium} (apt-get install chromium, or set CHROMIUM)`;

const outputDir = path.join(here, 'test-output');
const TIMEOUT = 20_000;

/** Serves the built page from dir on a free loopback port; any unknown path is the page. */
async function servePage(dir) {
  const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };
  const port = await freePort();
  const srv = http.createServer((req, res) => {
    const rel = decodeURIComponent(new URL(req.url, 'http://x').pathname).replace(/^\/+/, '');
    let file = path.join(dir, rel);
    if (!file.startsWith(dir) || !existsSync(file) || statSync(file).isDirectory()) file = path.join(dir, 'index.html');
    res.writeHead(200, { 'Content-Type': types[path.extname(file)] ?? 'application/octet-stream' });
    res.end(readFileSync(file));
  });
  await new Promise((resolve) => srv.listen(port, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${port}/`, close: () => new Promise((r) => srv.close(r)) };
}

/** A fresh PostgreSQL database on the server of SANDBOT_TEST_DATABASE_URL, or undefined. */
function newPostgresDatabase() {
  const admin = process.env.SANDBOT_TEST_DATABASE_URL;
  if (!admin) return undefined;
  const name = 'sandbot_web_' + randomUUID().replaceAll('-', '').slice(0, 12);
  try {
    execFileSync('psql', [admin, '-qc', `CREATE DATABASE ${name}`], { stdio: 'pipe' });
  } catch (err) {
    if (inCI) throw new Error(`cannot create a PostgreSQL database: ${err.stderr ?? err.message}`);
    return undefined;
  }
  const u = new URL(admin);
  u.pathname = '/' + name;
  return { url: u.toString(), drop: () => execFileSync('psql', [admin, '-qc', `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`], { stdio: 'pipe' }) };
}

/** A JSON API caller with a bearer token. */
function caller(baseUrl, token) {
  return async (method, p, body) => {
    const res = await fetch(baseUrl + p, {
      method,
      headers: { Authorization: `Bearer ${token}`, ...(body ? { 'Content-Type': 'application/fhir+json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: res.status, json, text };
  };
}

async function token(baseUrl, form, basic) {
  const res = await fetch(baseUrl + 'oauth2/token', {
    method: 'POST',
    headers: {
      'Content-Type': 'application/x-www-form-urlencoded',
      ...(basic ? { Authorization: 'Basic ' + Buffer.from(basic).toString('base64') } : {}),
    },
    body: new URLSearchParams(form),
  });
  const json = await res.json();
  assert.equal(res.status, 200, JSON.stringify(json));
  return json.access_token;
}

/**
 * Seeds a project with an admin user who has a password, a Patient and a Bot.
 * @returns {{ email: string, password: string, family: string, botName: string, api: Function }}
 */
async function seed(srv) {
  const su = caller(srv.baseUrl, await token(srv.baseUrl, { grant_type: 'client_credentials' }, `${srv.clientId}:${srv.clientSecret}`));
  const tag = randomUUID().slice(0, 8);
  const project = await su('POST', 'admin/Project', { resourceType: 'Project', name: `Web ${tag}`, strictMode: true });
  assert.equal(project.status, 201, project.text);
  const email = `ada-${tag}@example.com`;
  const password = 'analytical-engine';
  const invited = await su('POST', `admin/projects/${project.json.id}/invite`, {
    resourceType: 'Practitioner', firstName: 'Ada', lastName: 'Web', email, password, sendEmail: false, admin: true,
  });
  assert.equal(invited.status, 200, invited.text);
  const botName = `web-bot-${tag}`;
  const bot = await su('POST', `admin/projects/${project.json.id}/bot`, { name: botName, description: 'made by the browser test' });
  assert.ok(bot.status === 200 || bot.status === 201, bot.text);
  // The user's own token, through the password login, to seed a Patient in the project.
  const login = await fetch(srv.baseUrl + 'auth/login', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ email, password }),
  }).then((r) => r.json());
  assert.ok(login.code, JSON.stringify(login));
  const api = caller(srv.baseUrl, await token(srv.baseUrl, { grant_type: 'authorization_code', code: login.code }));
  const family = `Lovelace${tag}`;
  const patient = await api('POST', 'fhir/R4/Patient', { resourceType: 'Patient', name: [{ given: ['Ada'], family }], birthDate: '1815-12-10' });
  assert.equal(patient.status, 201, patient.text);
  return { email, password, family, botName, api, su };
}

let browser;
let page;
let site;
let buildDir;
let userDataDir;

before(async () => {
  if (skipAll) return;
  buildDir = mkdtempSync(path.join(os.tmpdir(), 'sandbot-web-page-'));
  await buildPage(buildDir);
  site = await servePage(buildDir);
  userDataDir = mkdtempSync(path.join(os.tmpdir(), 'sandbot-web-chromium-'));
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    userDataDir,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run', '--disable-quic'],
  });
});

after(async () => {
  await browser?.close();
  await site?.close();
  for (const d of [buildDir, userDataDir]) if (d) rmSync(d, { recursive: true, force: true });
});

/** Runs a step; on failure saves a screenshot and the page's console, and names them. */
function step(name, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      if (page) {
        mkdirSync(outputDir, { recursive: true });
        const file = path.join(outputDir, `${name.replace(/[^a-z0-9]+/gi, '-')}-${Date.now()}.png`);
        await page.screenshot({ path: file, fullPage: true }).catch(() => {});
        err.message += `\nscreenshot: ${file}\npage console:\n${pageLog.slice(-30).join('\n')}`;
      }
      throw err;
    }
  };
}

let pageLog = [];

const stores = [{ name: 'sqlite' }];
if (!skipAll && process.env.SANDBOT_TEST_DATABASE_URL) stores.push({ name: 'postgres' });

for (const store of stores) {
  describe(`web app components on ${store.name}`, { skip: skipAll }, () => {
    let srv;
    let db;
    let data;
    let patientId;

    before(async () => {
      if (store.name === 'postgres') {
        db = newPostgresDatabase();
        if (!db) throw new Error('SANDBOT_TEST_DATABASE_URL is set but no database could be created there');
      }
      srv = await startServer({
        databaseUrl: db?.url,
        env: { SANDBOT_CORS_ORIGINS: site.url.replace(/\/$/, '') },
      });
      data = await seed(srv);
      const context = await browser.createBrowserContext();
      page = await context.newPage();
      pageLog = [];
      page.on('console', (m) => pageLog.push(`${m.type()}: ${m.text()}`));
      page.on('pageerror', (e) => pageLog.push(`pageerror: ${e.message}`));
      page.on('requestfailed', (r) => pageLog.push(`requestfailed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
      page.setDefaultTimeout(TIMEOUT);
    });

    after(async () => {
      await page?.browserContext().close();
      page = undefined;
      await srv?.stop();
      db?.drop();
    });

    test('sign in with a password (SignInForm: /auth/method, /auth/login, /oauth2/token, /auth/me, across origins)', step('sign-in', async () => {
      assert.notEqual(new URL(site.url).origin, new URL(srv.baseUrl).origin, 'the page and the API are on different origins');
      const calls = [];
      page.on('response', (r) => calls.push(`${r.request().method()} ${new URL(r.url()).pathname} ${r.status()}`));
      await page.goto(`${site.url}?server=${encodeURIComponent(srv.baseUrl)}`);
      await page.waitForSelector('input[name="email"]');
      await page.type('input[name="email"]', data.email);
      await page.click('button[type="submit"]');
      await page.waitForSelector('input[name="password"]');
      await page.type('input[name="password"]', data.password);
      await page.click('button[type="submit"]');
      await page.waitForSelector('[data-testid="profile-name"]');
      const name = await page.$eval('[data-testid="profile-name"]', (e) => e.textContent);
      assert.equal(name, 'Ada');
      const project = await page.$eval('[data-testid="project-name"]', (e) => e.textContent);
      assert.match(project, /^Web /);
      for (const want of ['POST /auth/method 200', 'POST /auth/login 200', 'POST /oauth2/token 200', 'GET /auth/me 200']) {
        assert.ok(calls.includes(want), `${want} not among ${calls.join(', ')}`);
      }
    }));

    test('search Patients (SearchControl)', step('search-patients', async () => {
      await page.evaluate(() => (window.location.hash = '/Patient'));
      await page.waitForFunction((family) => [...document.querySelectorAll('[data-testid="search-control-row"]')]
        .some((r) => r.textContent.includes(family)), { timeout: TIMEOUT }, data.family);
    }));

    test('search Bots (SearchControl)', step('search-bots', async () => {
      await page.evaluate(() => (window.location.hash = '/Bot'));
      await page.waitForFunction((bot) => [...document.querySelectorAll('[data-testid="search-control-row"]')]
        .some((r) => r.textContent.includes(bot)), { timeout: TIMEOUT }, data.botName);
    }));

    test('open a record from the list (ResourceTable)', step('open-record', async () => {
      await page.evaluate(() => (window.location.hash = '/Patient'));
      const row = await page.waitForSelector(`xpath/.//tr[@data-testid="search-control-row"][contains(., "${data.family}")]`);
      await row.click();
      await page.waitForFunction((family) => document.querySelector('[data-testid="resource-table"]')?.textContent.includes(family),
        { timeout: TIMEOUT }, data.family);
    }));

    test('create a Patient through the form (ResourceForm)', step('create-patient', async () => {
      await page.evaluate(() => (window.location.hash = '/Patient/new'));
      await page.waitForSelector('[data-testid="new-resource"] button[title="Add Name"]');
      await page.click('[data-testid="new-resource"] button[title="Add Name"]');
      await page.type('[data-testid="new-resource"] input[placeholder="Given"]', 'Grace');
      await page.type('[data-testid="new-resource"] input[placeholder="Family"]', 'Hopper' + data.family);
      await page.click('[data-testid="new-resource"] button[type="submit"]');
      await page.waitForSelector('[data-testid="resource"][data-version]');
      patientId = await page.evaluate(() => window.location.hash.split('/')[2]);
      const created = await data.api('GET', `fhir/R4/Patient/${patientId}`);
      assert.equal(created.status, 200);
      assert.equal(created.json.name[0].family, 'Hopper' + data.family);
    }));

    test('edit the Patient through the form and see its history (ResourceForm, ResourceHistoryTable)', step('edit-patient', async () => {
      assert.ok(patientId, 'the create step ran');
      const family = '[data-testid="resource-form"] input[placeholder="Family"]';
      await page.waitForSelector(family);
      const before = await page.$eval('[data-testid="resource"]', (e) => e.dataset.version);
      await page.$eval(family, (el) => el.select());
      await page.type(family, 'Edited' + data.family);
      await page.click('[data-testid="resource-form"] button[type="submit"]');
      await page.waitForFunction((v) => document.querySelector('[data-testid="resource"]')?.dataset.version !== v,
        { timeout: TIMEOUT }, before);
      const edited = await data.api('GET', `fhir/R4/Patient/${patientId}`);
      assert.equal(edited.json.name[0].family, 'Edited' + data.family);
      await page.waitForFunction(() => document.querySelectorAll('[data-testid="resource-history"] tbody tr').length === 2,
        { timeout: TIMEOUT });
    }));
  });
}
