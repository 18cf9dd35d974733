// The official CLI, unchanged, against sandbot: `medplum bot deploy` reads
// medplum.config.json, uploads the source as a Binary, saves the Bot, and
// posts the dist file as text to $deploy. A WASM bot's dist file is the module
// in base64 (docs/decisions.md 13), so the CLI's UTF-8 handling cannot corrupt it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, writeFile, mkdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time, which
// Node 20 only has behind --experimental-websocket; a stub is enough here.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient } = await import('@medplum/core');

const here = path.dirname(fileURLToPath(import.meta.url));
const cli = path.join(here, 'node_modules', '@medplum', 'cli', 'dist', 'cjs', 'index.cjs');
let server;
let work;

before(async () => {
  server = await startServer();
  work = await mkdtemp(path.join(tmpdir(), 'sandbot-cli-'));
});

after(async () => {
  await server?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

function medplum(args, cwd) {
  return new Promise((resolve) => {
    execFile(process.execPath, [cli, ...args], {
      cwd,
      env: {
        ...process.env,
        HOME: cwd, // the CLI keeps its profiles under ~/.medplum
        MEDPLUM_BASE_URL: server.baseUrl,
        MEDPLUM_CLIENT_ID: server.clientId,
        MEDPLUM_CLIENT_SECRET: server.clientSecret,
      },
      timeout: 60_000,
    }, (err, stdout, stderr) => resolve({ code: err ? err.code ?? 1 : 0, stdout, stderr }));
  });
}

test('medplum bot deploy ships a base64 WASM dist file that $execute then runs', async () => {
  const client = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await client.startClientLogin(server.clientId, server.clientSecret);
  const bot = await client.createResource({ resourceType: 'Bot', name: 'cli-echo' });

  const wasm = await readFile(path.join(here, '..', 'examples', 'c-echo', 'c-echo.wasm'));
  await mkdir(path.join(work, 'src'));
  await mkdir(path.join(work, 'dist'));
  await writeFile(path.join(work, 'src', 'echo.c'), await readFile(path.join(here, '..', 'examples', 'c-echo', 'echo.c')));
  await writeFile(path.join(work, 'dist', 'echo.wasm.b64'), wasm.toString('base64'));
  await writeFile(path.join(work, 'medplum.config.json'), JSON.stringify({
    bots: [{ name: 'cli-echo', id: bot.id, source: 'src/echo.c', dist: 'dist/echo.wasm.b64' }],
  }));

  const out = await medplum(['bot', 'deploy', 'cli-echo'], work);
  assert.equal(out.code, 0, `medplum bot deploy failed:\n${out.stdout}\n${out.stderr}`);
  assert.match(out.stdout, /All OK/, out.stdout + out.stderr);

  const saved = await client.readResource('Bot', bot.id);
  assert.equal(saved.executableCode?.contentType, 'application/wasm');
  assert.match(saved.sourceCode?.url ?? '', /Binary\//, 'the CLI saved the uploaded source');

  const answer = await client.executeBot(bot.id, 'deployed by the CLI', 'text/plain');
  assert.equal(answer, 'deployed by the CLI');
});
