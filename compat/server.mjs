// Builds and starts a real sandbot server for compatibility tests.
//
//   import { startServer } from './server.mjs';
//   const srv = await startServer();          // { baseUrl, clientId, clientSecret, stop() }
//   ...
//   const { code, signal } = await srv.stop(); // SIGTERM, waits for exit, removes temp dirs
//
// The binary is built once per process with `go build ./cmd/sandbot` (cwd = the
// repo root) into <tmpdir>/sandbot-compat-<pid>/, unless env SANDBOT_BIN names one.
// Each server gets two free loopback ports, a fresh SQLite data dir (or
// SANDBOT_DATABASE_URL from opts.databaseUrl / env SANDBOT_COMPAT_DATABASE_URL),
// and a random bootstrap super-admin client id and secret.
//
// opts (all optional):
//   databaseUrl    postgres:// URL instead of the embedded store
//   env            extra environment variables for the server
//   args           extra command-line flags after `serve`
//   startTimeoutMs how long to wait for GET /healthcheck = 200 (default 20000)
//   stopTimeoutMs  how long stop() waits after SIGTERM before SIGKILL (default 15000)
//   allowNonZeroExit  stop() resolves instead of rejecting when the exit code is not 0
import { spawn, execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, mkdirSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const buildDir = path.join(os.tmpdir(), `sandbot-compat-${process.pid}`);

let buildPromise;
const live = new Set(); // child processes not yet exited

const tmpDirs = new Set(); // data dirs of servers not yet stopped

// Last resort for callers that forget stop() or are interrupted: never leave a
// server or a temp dir behind.
function killAll() {
  for (const child of live) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const dir of tmpDirs) rmSync(dir, { recursive: true, force: true });
  if (buildPromise) rmSync(buildDir, { recursive: true, force: true });
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, function onSignal() {
    killAll();
    // Keep the default behaviour (terminate) unless someone else handles it.
    if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
  });
}

/** Returns the path of the sandbot binary, building it once per process. */
export function buildBinary() {
  if (process.env.SANDBOT_BIN) return Promise.resolve(process.env.SANDBOT_BIN);
  buildPromise ??= new Promise((resolve, reject) => {
    mkdirSync(buildDir, { recursive: true });
    const out = path.join(buildDir, 'sandbot');
    execFile(
      'go',
      ['build', '-o', out, './cmd/sandbot'],
      { cwd: repoRoot, maxBuffer: 16 << 20 },
      (err, _stdout, stderr) => {
        if (err) reject(new Error(`go build ./cmd/sandbot failed: ${err.message}\n${stderr}`));
        else resolve(out);
      }
    );
  });
  return buildPromise;
}

/** A free loopback TCP port (listen on 0, read it, close). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Starts a sandbot server.
 * @returns {Promise<{baseUrl: string, opsUrl: string, clientId: string, clientSecret: string,
 *   dataDir: string|undefined, logs: () => string, stop: () => Promise<{code: number|null, signal: string|null}>}>}
 */
export async function startServer(opts = {}) {
  const bin = await buildBinary();
  const startTimeoutMs = opts.startTimeoutMs ?? 20_000;
  const stopTimeoutMs = opts.stopTimeoutMs ?? 15_000;

  const p1 = await freePort();
  let p2 = await freePort();
  while (p2 === p1) p2 = await freePort();
  const baseUrl = `http://127.0.0.1:${p1}/`;
  const opsUrl = `http://127.0.0.1:${p2}/`;
  const clientId = randomUUID();
  const clientSecret = randomBytes(16).toString('hex'); // 32 hex chars

  const databaseUrl = opts.databaseUrl ?? process.env.SANDBOT_COMPAT_DATABASE_URL;
  const tmpDir = mkdtempSync(path.join(os.tmpdir(), 'sandbot-compat-data-'));
  tmpDirs.add(tmpDir);
  const env = {
    ...process.env,
    SANDBOT_ADDR: `127.0.0.1:${p1}`,
    SANDBOT_METRICS_ADDR: `127.0.0.1:${p2}`,
    SANDBOT_BASE_URL: baseUrl,
    SANDBOT_ADMIN_CLIENT_ID: clientId,
    SANDBOT_ADMIN_CLIENT_SECRET: clientSecret,
    ...opts.env,
  };
  // The data dir also holds the module compilation cache, so it is set either way.
  env.SANDBOT_DATA_DIR = tmpDir;
  if (databaseUrl) env.SANDBOT_DATABASE_URL = databaseUrl;
  else delete env.SANDBOT_DATABASE_URL;

  const child = spawn(bin, ['serve', ...(opts.args ?? [])], {
    cwd: tmpDir,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  let output = '';
  const keep = (chunk) => {
    output += chunk;
    if (output.length > 1 << 20) output = output.slice(-(1 << 19)); // bounded
  };
  child.stdout.setEncoding('utf8').on('data', keep);
  child.stderr.setEncoding('utf8').on('data', keep);
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
    child.on('error', (err) => {
      live.delete(child);
      resolve({ code: null, signal: null, error: err });
    });
  });
  let exitInfo;
  exited.then((info) => (exitInfo = info));

  const cleanup = () => {
    rmSync(tmpDir, { recursive: true, force: true });
    tmpDirs.delete(tmpDir);
  };
  const logs = () => output;

  // Wait for GET /healthcheck = 200.
  const deadline = Date.now() + startTimeoutMs;
  let lastErr = '';
  for (;;) {
    if (exitInfo) {
      cleanup();
      throw new Error(
        `sandbot exited during startup (code ${exitInfo.code}, signal ${exitInfo.signal}` +
          `${exitInfo.error ? `, ${exitInfo.error.message}` : ''})\n--- server output ---\n${output}`
      );
    }
    try {
      const res = await fetch(baseUrl + 'healthcheck', { signal: AbortSignal.timeout(2000) });
      await res.arrayBuffer();
      if (res.status === 200) break;
      lastErr = `status ${res.status}`;
    } catch (err) {
      lastErr = err.cause?.code ?? err.message;
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      await exited;
      cleanup();
      throw new Error(
        `sandbot did not answer ${baseUrl}healthcheck with 200 within ${startTimeoutMs} ms (last: ${lastErr})` +
          `\n--- server output ---\n${output}`
      );
    }
    await sleep(50);
  }

  let stopping;
  async function stop() {
    stopping ??= (async () => {
      if (!exitInfo) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), stopTimeoutMs);
      const info = await exited;
      clearTimeout(timer);
      cleanup();
      if (info.code !== 0 && !opts.allowNonZeroExit) {
        throw new Error(
          `sandbot did not exit cleanly after SIGTERM (code ${info.code}, signal ${info.signal})` +
            `\n--- server output ---\n${output}`
        );
      }
      return { code: info.code, signal: info.signal };
    })();
    return stopping;
  }

  return { baseUrl, opsUrl, clientId, clientSecret, dataDir: databaseUrl ? undefined : tmpDir, logs, stop };
}
