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

// JavaScript bots in the reference's style, created and deployed by the CLI
// (`medplum bot create --runtime-version vmcontext`, then `medplum bot
// deploy`, which sends the dist file as text) and executed through
// @medplum/core: the examples in examples/js, and a TypeScript bot compiled
// with esbuild the way the reference's projects compile theirs.
test('medplum bot create and deploy ship JavaScript bots that executeBot runs', async () => {
  const client = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await client.startClientLogin(server.clientId, server.clientSecret);
  const me = await client.get('auth/me');
  const projectId = me.project.id;
  const examples = path.join(here, '..', 'examples', 'js');
  const dir = path.join(work, 'js');
  await mkdir(path.join(dir, 'src'), { recursive: true });
  await mkdir(path.join(dir, 'dist'), { recursive: true });

  // The TypeScript example, built as its esbuild script says.
  const esbuild = await import('esbuild');
  const { options } = await import(path.join(examples, 'typescript', 'esbuild-script.mjs'));
  await esbuild.build({ ...options, outfile: path.join(dir, 'dist', 'typescript.js') });
  const built = await readFile(path.join(dir, 'dist', 'typescript.js'), 'utf8');
  assert.match(built, /require\("@medplum\/core"\)/, 'esbuild left @medplum/core external');

  const bots = {};
  for (const name of ['hello', 'hl7-ack', 'patients', 'typescript']) {
    const src = name === 'typescript' ? path.join(examples, 'typescript', 'src', 'index.ts') : path.join(examples, name + '.js');
    await writeFile(path.join(dir, 'src', path.basename(src)), await readFile(src));
    if (name !== 'typescript') await writeFile(path.join(dir, 'dist', name + '.js'), await readFile(src));
    const out = await medplum(['bot', 'create', 'js-' + name, projectId, 'src/' + path.basename(src), 'dist/' + name + '.js',
      '--runtime-version', 'vmcontext'], dir);
    assert.equal(out.code, 0, `medplum bot create ${name} failed:\n${out.stdout}\n${out.stderr}`);
    const id = /Bot created: ([\w-]+)/.exec(out.stdout)?.[1];
    assert.ok(id, out.stdout);
    bots[name] = id;
    // And `medplum bot deploy` by name from the config the CLI wrote.
    const dep = await medplum(['bot', 'deploy', 'js-' + name], dir);
    assert.equal(dep.code, 0, `medplum bot deploy ${name} failed:\n${dep.stdout}\n${dep.stderr}`);
    assert.match(dep.stdout, /All OK/, dep.stdout + dep.stderr);
    const saved = await client.readResource('Bot', id);
    assert.equal(saved.executableCode?.contentType, 'application/javascript');
    assert.equal(saved.runtimeVersion, 'vmcontext');
  }

  assert.deepEqual(await client.executeBot(bots.hello, { name: 'Ada' }), { greeting: 'Hello, Ada' });

  const msg = 'MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240102030405||ORU^R01|CTRL-7|P|2.5.1\rPID|1||123||Doe^Jane\r';
  const ack = await client.executeBot(bots['hl7-ack'], msg, 'x-application/hl7-v2+er7');
  assert.match(ack, /^MSH\|\^~\\&\|EHR\|HOSP\|LAB\|HOSP\|/);
  assert.match(ack, /\rMSA\|AA\|CTRL-7\|OK/);

  const found = await client.executeBot(bots.patients, { given: 'Ada', family: 'Lovelace-' + bots.patients }, 'application/json');
  assert.match(found.created.reference, /^Patient\//);
  assert.deepEqual(found.found, [found.created.reference]);
  await assert.rejects(client.executeBot(bots.patients, { given: 'Ada' }, 'application/json'), /family is required/);

  const ts = await client.executeBot(bots.typescript, { resourceType: 'Patient', name: [{ given: ['Grace'], family: 'Hopper' }] }, 'application/fhir+json');
  assert.equal(ts.name, 'Grace Hopper');
  const obs = await client.readReference({ reference: ts.observation });
  assert.equal(obs.valueString, 'Grace Hopper');
});
