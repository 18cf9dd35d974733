// The reference approach to in-process bots, as a peer for sandbot's bot
// benchmark: every request runs the bot's code in a fresh V8 context with
// vm.runInNewContext, as the reference platform's "vmcontext" runtime does.
// The handler is the same trivial one the C echo and Go hello bots run.
//
// Usage: node node-vm-peer.mjs <port> [echo|hello|medplum]
//
// "medplum" is the reference's vmcontext runtime as it runs a JavaScript bot:
// per request, a fresh context with the globals it exposes, in which a real
// MedplumClient (@medplum/core, from runtime/jsengine's lockfile: run `make
// js` first) is created and the trivial bot `return { ok: true }` is called
// with it; the peer of sandbot's JavaScript bots.
import http from 'node:http';
import { createRequire } from 'node:module';
import vm from 'node:vm';

const port = Number(process.argv[2] || 8200);
const kind = process.argv[3] || 'echo';

// The bot source, as the reference keeps it: a CommonJS module with a handler.
const sources = {
  echo: `exports.handler = async function handler(medplum, event) { return event.input; };`,
  hello: `exports.handler = async function handler(medplum, event) {
    const name = (event.input && event.input.name || '').trim() || 'world';
    console.log('greeting ' + name);
    return { greeting: 'Hello, ' + name };
  };`,
};
// The reference's vmcontext wrapper, paraphrased: the client is made inside
// the context, per execution, and the handler awaited.
const medplumCode = `
  const exports = {};
  const module = { exports };
  exports.handler = async function handler(medplum, event) { return { ok: true }; };
  (async () => {
    const { bot, baseUrl, accessToken, contentType, secrets, traceId, headers } = event;
    const medplum = new MedplumClient({ baseUrl, fetch: (url, options = {}) => fetch(url, options) });
    medplum.setAccessToken(accessToken);
    let input = event.input;
    if (contentType === ContentType.HL7_V2 && input) input = Hl7Message.parse(input);
    let result = await exports.handler(medplum, { bot, input, contentType, secrets, traceId, headers });
    if (contentType === ContentType.HL7_V2 && result) result = result.toString();
    return result;
  })();
`;
let core;
if (kind === 'medplum') {
  globalThis.WebSocket ??= class WebSocket {}; // @medplum/core names it at load (Node 20)
  const require = createRequire(new URL('../../runtime/jsengine/package.json', import.meta.url));
  core = require('@medplum/core');
}

const code = `
  const exports = {};
  const module = { exports };
  ${sources[kind]}
  const result = exports.handler(null, event);
  result;
`;

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    try {
      const body = Buffer.concat(chunks).toString('utf8');
      const event = { bot: { reference: 'Bot/peer' }, input: JSON.parse(body || '{}'), contentType: req.headers['content-type'], secrets: {} };
      const logs = [];
      const botConsole = { log: (...a) => logs.push(a.join(' ')) };
      let result;
      if (kind === 'medplum') {
        event.baseUrl = 'http://127.0.0.1:8103/';
        event.accessToken = 'token';
        event.traceId = 'trace';
        event.headers = req.headers;
        const sandbox = {
          console: botConsole, fetch, require: (m) => (m === '@medplum/core' ? core : undefined), ContentType: core.ContentType,
          Hl7Message: core.Hl7Message, MedplumClient: core.MedplumClient, TextEncoder, TextDecoder, URL, URLSearchParams,
          Headers, Request, Response, event,
        };
        result = await vm.runInNewContext(medplumCode, sandbox, { timeout: 10000 });
      } else {
        const sandbox = { event, console: botConsole };
        result = await vm.runInNewContext(code, sandbox, { timeout: 10000 });
      }
      const out = JSON.stringify(result);
      res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(out) });
      res.end(out);
    } catch (err) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: String(err) }));
    }
  });
});
server.listen(port, '127.0.0.1', () => console.error(`node vm peer (${kind}) on 127.0.0.1:${port}`));
