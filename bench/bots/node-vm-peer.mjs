// The reference approach to in-process bots, as a peer for sandbot's bot
// benchmark: every request runs the bot's code in a fresh V8 context with
// vm.runInNewContext, as the reference platform's "vmcontext" runtime does.
// The handler is the same trivial one the C echo and Go hello bots run.
//
// Usage: node node-vm-peer.mjs <port> [echo|hello]
import http from 'node:http';
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
      const sandbox = { event, console: { log: (...a) => logs.push(a.join(' ')) } };
      const result = await vm.runInNewContext(code, sandbox, { timeout: 10000 });
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
