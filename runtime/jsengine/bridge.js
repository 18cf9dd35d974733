// The bridge between sandbot's runtime and a JavaScript bot, evaluated once
// into the engine's base snapshot after polyfills.js and @medplum/core: the
// globals of the reference platform's vm context (console, fetch, require,
// crypto, MedplumClient, Hl7Message, ContentType), the one MedplumClient a bot
// gets, loading a bot's module, and running one execution. Everything the
// bot reaches outside the engine goes through __sandbot_host(op, arg), a host
// function answered by runtime/js.go: "log", "fhir", "random" and "done".
'use strict';
(function (g) {
  const host = g.__sandbot_host;
  delete g.__sandbot_host;
  const core = g.__sandbot_core;
  delete g.__sandbot_core;
  const baseUrl = g.__sandbot_base_url;
  delete g.__sandbot_base_url;
  const fhirBase = baseUrl + 'fhir/R4/';
  const define = (name, value) =>
    Object.defineProperty(g, name, { value, writable: true, configurable: true, enumerable: false });

  // ---- console: every line goes to the execution's log ----
  const show = (v, depth) => {
    if (typeof v === 'string') return v;
    if (v instanceof Error) return v.stack ? `${v.name}: ${v.message}\n${v.stack}`.trimEnd() : `${v.name}: ${v.message}`;
    if (typeof v === 'function') return `[Function: ${v.name || '(anonymous)'}]`;
    if (typeof v === 'symbol' || typeof v === 'bigint') return String(v);
    if (typeof v !== 'object' || v === null) return String(v);
    if (v instanceof core.Hl7Message) return v.toString();
    try {
      const s = JSON.stringify(v, (k, x) => (typeof x === 'bigint' ? String(x) : x));
      return s === undefined ? String(v) : s;
    } catch {
      return depth ? '[Object]' : Object.prototype.toString.call(v);
    }
  };
  const format = (args) => {
    if (typeof args[0] === 'string' && args.length > 1 && /%[sdifjoO%]/.test(args[0])) {
      let i = 1;
      const head = args[0].replace(/%[sdifjoO%]/g, (m) => {
        if (m === '%%') return '%';
        if (i >= args.length) return m;
        const a = args[i++];
        if (m === '%d' || m === '%i') return String(m === '%i' ? parseInt(a) : Number(a));
        if (m === '%f') return String(parseFloat(a));
        return show(a, 1);
      });
      return [head, ...args.slice(i).map((a) => show(a, 0))].join(' ');
    }
    return args.map((a) => show(a, 0)).join(' ');
  };
  const log = (level) => (...args) => void host('log', level + format(args));
  const counts = new Map();
  const started = new Map();
  define('console', {
    debug: log('0'),
    trace: log('0'),
    log: log('1'),
    info: log('1'),
    warn: log('2'),
    error: log('3'),
    dir: (v) => void host('log', '1' + show(v, 0)),
    table: (v) => void host('log', '1' + show(v, 0)),
    assert: (ok, ...args) => {
      if (!ok) host('log', '3Assertion failed' + (args.length ? ': ' + format(args) : ''));
    },
    count: (label = 'default') => {
      counts.set(label, (counts.get(label) || 0) + 1);
      host('log', `1${label}: ${counts.get(label)}`);
    },
    time: (label = 'default') => void started.set(label, Date.now()),
    timeEnd: (label = 'default') => {
      if (started.has(label)) host('log', `1${label}: ${Date.now() - started.get(label)}ms`);
      started.delete(label);
    },
  });

  // ---- randomness, drawn afresh by every execution ----
  // Math.random is xoshiro128** seeded by the host at the start of each
  // execution (the engine's own generator is part of the snapshot and would
  // repeat its sequence in every execution); crypto.getRandomValues asks the
  // host's cryptographic source.
  const seed = new Uint32Array(4);
  const reseed = (hex) => {
    for (let i = 0; i < 4; i++) seed[i] = parseInt(hex.slice(i * 8, i * 8 + 8), 16) >>> 0;
    if ((seed[0] | seed[1] | seed[2] | seed[3]) === 0) seed[0] = 1;
  };
  const rotl = (x, k) => (x << k) | (x >>> (32 - k));
  const next32 = () => {
    const result = Math.imul(rotl(Math.imul(seed[1], 5), 7), 9) >>> 0;
    const t = seed[1] << 9;
    seed[2] ^= seed[0];
    seed[3] ^= seed[1];
    seed[1] ^= seed[2];
    seed[0] ^= seed[3];
    seed[2] ^= t;
    seed[3] = rotl(seed[3], 11);
    return result;
  };
  // 53 random bits in [0, 1), as V8 gives.
  Math.random = function random() {
    return ((next32() >>> 5) * 67108864 + (next32() >>> 6)) / 9007199254740992;
  };
  const getRandomValues = (array) => {
    if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array || array instanceof DataView) {
      throw new TypeError('crypto.getRandomValues: the argument must be an integer typed array');
    }
    if (array.byteLength > 65536) {
      throw new RangeError(`crypto.getRandomValues: ${array.byteLength} bytes requested, over the limit of 65536`);
    }
    const hex = host('random', String(array.byteLength));
    const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
    for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.substr(i * 2, 2), 16);
    return array;
  };
  const randomUUID = () => {
    const b = getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  };
  define('crypto', { getRandomValues, randomUUID });

  // ---- fetch: the server's own FHIR API, nothing else ----
  const networkRule = `the bot sandbox has no network: fetch reaches only this server's FHIR API (${fhirBase}), answered in-process as the bot's own project membership`;
  const fetch = async (input, init) => {
    const req = new Request(input, init);
    const url = new URL(req.url).href;
    if (!url.startsWith(fhirBase)) {
      throw new TypeError(`fetch ${url} refused: ${networkRule}`);
    }
    const body = req._body;
    let json;
    if (body !== null && body !== '') {
      try {
        json = JSON.parse(body);
      } catch {
        throw new TypeError(`fetch ${req.method} ${url}: the body must be JSON (${networkRule})`);
      }
    }
    // The headers of conditional requests (createResourceIfNoneExist,
    // If-Match) travel with the request; others mean nothing in-process.
    const ifNoneExist = req.headers.get('if-none-exist') || undefined;
    const ifMatch = req.headers.get('if-match') || undefined;
    const reply = JSON.parse(
      host('fhir', JSON.stringify({ method: req.method, url: url.slice(fhirBase.length), body: json, ifNoneExist, ifMatch }))
    );
    const text = reply.body === undefined || reply.body === null ? '' : JSON.stringify(reply.body);
    const contentType = reply.status >= 200 && typeof reply.body === 'object' ? 'application/fhir+json' : 'application/json';
    return new Response(reply.status === 204 ? null : text, {
      status: reply.status,
      headers: text === '' ? {} : { 'content-type': contentType },
      url,
    });
  };
  define('fetch', fetch);

  // ---- require: @medplum/core only, as bundled bots expect ----
  const require = (name) => {
    if (name === '@medplum/core') return core;
    throw new Error(
      `Cannot find module '${name}': a sandbot JavaScript bot may require only @medplum/core; bundle other dependencies into the bot (esbuild --bundle)`
    );
  };
  define('require', require);
  define('Hl7Message', core.Hl7Message);
  define('MedplumClient', core.MedplumClient);
  define('ContentType', core.ContentType);

  // ES modules import @medplum/core through this module's source (see js.go).
  define(
    '__sandbot_core_module',
    'const c = globalThis.require("@medplum/core");\nexport default c;\nexport const { ' +
      Object.keys(core)
        .filter((k) => /^[A-Za-z_$][\w$]*$/.test(k) && k !== 'default')
        .join(', ') +
      ' } = c;\n'
  );

  // The one client of every execution: fresh in each, since each starts from
  // the snapshot. It has no token: its requests are answered in-process.
  const medplum = new core.MedplumClient({ baseUrl, fetch, cacheTime: 0 });

  // ---- loading the bot's module (at deploy, into its snapshot) ----
  let handler = null;
  const takeHandler = (exp, what) => {
    const h = exp && (typeof exp.handler === 'function' ? exp.handler : exp.default && exp.default.handler);
    if (typeof h !== 'function') {
      throw new TypeError(`${what} does not export a handler function (exports.handler = async (medplum, event) => ...)`);
    }
    handler = h;
  };
  define('__sandbot_load_cjs', (fn, filename) => {
    const module = { exports: {} };
    fn.call(module.exports, module.exports, require, module, filename, '/');
    takeHandler(module.exports, 'The bot');
  });
  define('__sandbot_load_esm', (ns) => takeHandler(ns, 'The bot module'));

  // Describes an exception for the host: name, message, and the line and
  // column of its first stack frame (for a SyntaxError, where the parser
  // stopped).
  define('__sandbot_describe', (e) => {
    const d = { name: '', message: '', line: 0, column: 0, stack: '' };
    if (e instanceof Error) {
      d.name = String(e.name);
      d.message = String(e.message);
      d.stack = String(e.stack || '');
      const m = /:(\d+):(\d+)\)?\s*$/m.exec(d.stack);
      if (m) (d.line = Number(m[1])), (d.column = Number(m[2]));
    } else {
      d.message = show(e, 0);
    }
    return JSON.stringify(d);
  });

  // ---- one execution ----
  const outcomeOf = (err) => {
    if (err && typeof err === 'object' && err.outcome && err.outcome.resourceType === 'OperationOutcome') {
      return err.outcome;
    }
    return undefined;
  };
  const envelope = (value, event) => {
    if (value instanceof Response) {
      const ct = value.headers.get('content-type') || '';
      let result = value._body === null ? null : value._body;
      if (result !== null && /^application\/([\w.-]+\+)?json\b/i.test(ct)) {
        try {
          result = JSON.parse(result);
        } catch {
          throw new TypeError(`The bot's Response says ${ct} but its body is not JSON`);
        }
      }
      const env = { result, status: value.status };
      if (ct) env.contentType = ct;
      return JSON.stringify(env);
    }
    if (value instanceof core.Hl7Message) value = value.toString();
    if (value === undefined) return '{}';
    if (value && typeof value === 'object' && value.resourceType === 'Binary') {
      // As the reference sends a Binary: its content, with its content type,
      // to a GET that does not ask for FHIR JSON (when the content is text);
      // else the resource as FHIR JSON.
      const accept = (event.headers && event.headers.accept) || '';
      if (event.contentType === '' && !accept.includes('application/fhir+json') && typeof value.data === 'string') {
        try {
          const bytes = Uint8Array.from(atob(value.data), (c) => c.charCodeAt(0));
          const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
          return JSON.stringify({ result: text, contentType: value.contentType || 'application/octet-stream' });
        } catch {
          // not text: the resource itself
        }
      }
      return JSON.stringify({ result: value, contentType: 'application/fhir+json' });
    }
    const s = JSON.stringify({ result: value });
    return s;
  };
  const finish = (value, event) => {
    let out;
    try {
      out = envelope(value, event);
    } catch (err) {
      return fail(err);
    }
    host('done', out);
  };
  const fail = (err) => {
    const msg = err instanceof Error ? err.message : typeof err === 'string' ? err : show(err, 0);
    const stack = err instanceof Error && err.stack ? '\n' + err.stack.trimEnd() : '';
    host('log', '3Unhandled error: ' + msg + stack);
    const outcome = outcomeOf(err);
    host('done', JSON.stringify({ error: outcome || String(msg) }));
  };
  define('__sandbot_run', (arg) => {
    reseed(arg.slice(0, 32));
    const event = JSON.parse(arg.slice(32));
    if (event.contentType === core.ContentType.HL7_V2 && typeof event.input === 'string') {
      event.input = core.Hl7Message.parse(event.input);
    }
    let result;
    try {
      result = handler(medplum, event);
    } catch (err) {
      return fail(err);
    }
    if (result && typeof result.then === 'function') {
      result.then((v) => finish(v, event), fail);
    } else {
      finish(result, event);
    }
  });
})(globalThis);
