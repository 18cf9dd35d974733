// Web platform globals that QuickJS lacks and that the reference platform's
// bot sandbox (Node's vm context) exposes: TextEncoder, TextDecoder, URL,
// URLSearchParams, Headers, Request, Response, timers and structuredClone.
// They are deliberately small: what bots and @medplum/core use, following the
// WHATWG specifications where they are used (UTF-8 only, special URL schemes,
// text and JSON bodies). sandbot's own code, evaluated once into the engine's
// base snapshot; tested by runtime/js_test.go.
'use strict';
(function (g) {
  const define = (name, value) =>
    Object.defineProperty(g, name, { value, writable: true, configurable: true, enumerable: false });

  // ---- TextEncoder / TextDecoder (UTF-8) ----
  class TextEncoder {
    get encoding() {
      return 'utf-8';
    }
    encode(input = '') {
      const s = String(input);
      const out = [];
      for (let i = 0; i < s.length; i++) {
        let c = s.charCodeAt(i);
        if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
          const d = s.charCodeAt(i + 1);
          if (d >= 0xdc00 && d <= 0xdfff) {
            c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
            i++;
          } else {
            c = 0xfffd;
          }
        } else if (c >= 0xd800 && c <= 0xdfff) {
          c = 0xfffd; // a lone surrogate
        }
        if (c < 0x80) out.push(c);
        else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
        else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
        else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
      }
      return new Uint8Array(out);
    }
    encodeInto(input, dest) {
      const b = this.encode(input);
      const n = Math.min(b.length, dest.length);
      dest.set(b.subarray(0, n));
      return { read: String(input).length, written: n };
    }
  }

  class TextDecoder {
    constructor(label = 'utf-8', options = {}) {
      const l = String(label).trim().toLowerCase();
      if (l !== 'utf-8' && l !== 'utf8' && l !== 'unicode-1-1-utf-8') {
        throw new RangeError(`The "${label}" encoding is not supported (only utf-8)`);
      }
      this.fatal = !!options.fatal;
      this.ignoreBOM = !!options.ignoreBOM;
    }
    get encoding() {
      return 'utf-8';
    }
    decode(input) {
      if (input === undefined) return '';
      let b;
      if (input instanceof ArrayBuffer) b = new Uint8Array(input);
      else if (ArrayBuffer.isView(input)) b = new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
      else throw new TypeError('TextDecoder.decode: input must be an ArrayBuffer or a view of one');
      let i = 0;
      if (!this.ignoreBOM && b.length >= 3 && b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf) i = 3;
      const parts = [];
      let codes = [];
      const bad = () => {
        if (this.fatal) throw new TypeError('The encoded data was not valid utf-8');
        codes.push(0xfffd);
      };
      while (i < b.length) {
        const c = b[i];
        let need = 0;
        let cp = 0;
        let lower = 0x80;
        let upper = 0xbf;
        if (c < 0x80) {
          codes.push(c);
          i++;
        } else {
          if (c >= 0xc2 && c <= 0xdf) (need = 1), (cp = c & 0x1f);
          else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            cp = c & 0xf;
            if (c === 0xe0) lower = 0xa0;
            if (c === 0xed) upper = 0x9f;
          } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            cp = c & 0x7;
            if (c === 0xf0) lower = 0x90;
            if (c === 0xf4) upper = 0x8f;
          } else {
            bad();
            i++;
            continue;
          }
          let j = 1;
          for (; j <= need; j++) {
            const d = b[i + j];
            if (d === undefined || d < lower || d > upper) break;
            lower = 0x80;
            upper = 0xbf;
            cp = (cp << 6) | (d & 0x3f);
          }
          if (j <= need) {
            bad();
            i += j; // the maximal subpart is one error
            continue;
          }
          i += need + 1;
          if (cp >= 0x10000) {
            cp -= 0x10000;
            codes.push(0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
          } else codes.push(cp);
        }
        if (codes.length >= 8192) {
          parts.push(String.fromCharCode.apply(null, codes));
          codes = [];
        }
      }
      parts.push(String.fromCharCode.apply(null, codes));
      return parts.join('');
    }
  }

  // ---- URLSearchParams ----
  const formEncode = (s) =>
    encodeURIComponent(s)
      .replace(/%20/g, '+')
      .replace(/[!'()~]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
  const formDecode = (s) => {
    s = s.replace(/\+/g, ' ');
    try {
      return decodeURIComponent(s);
    } catch {
      return s.replace(/%([0-9a-fA-F]{2})/g, (m, h) => String.fromCharCode(parseInt(h, 16)));
    }
  };
  const paramsOwner = Symbol('url');

  class URLSearchParams {
    constructor(init = '') {
      this._list = [];
      this[paramsOwner] = null;
      if (init instanceof URLSearchParams) {
        this._list = init._list.map((p) => [p[0], p[1]]);
      } else if (typeof init === 'object' && init !== null) {
        if (typeof init[Symbol.iterator] === 'function') {
          for (const pair of init) {
            const p = Array.from(pair);
            if (p.length !== 2) throw new TypeError('URLSearchParams: each pair must have two elements');
            this._list.push([String(p[0]), String(p[1])]);
          }
        } else {
          for (const k of Object.keys(init)) this._list.push([k, String(init[k])]);
        }
      } else {
        this._parse(String(init));
      }
    }
    _parse(s) {
      this._list = [];
      if (s.startsWith('?')) s = s.slice(1);
      for (const part of s.split('&')) {
        if (part === '') continue;
        const eq = part.indexOf('=');
        const k = eq < 0 ? part : part.slice(0, eq);
        const v = eq < 0 ? '' : part.slice(eq + 1);
        this._list.push([formDecode(k), formDecode(v)]);
      }
    }
    _update() {
      const u = this[paramsOwner];
      if (u) {
        const q = this.toString();
        u._query = q === '' ? null : q;
      }
    }
    get size() {
      return this._list.length;
    }
    append(k, v) {
      this._list.push([String(k), String(v)]);
      this._update();
    }
    delete(k, v) {
      k = String(k);
      this._list = this._list.filter((p) => !(p[0] === k && (v === undefined || p[1] === String(v))));
      this._update();
    }
    get(k) {
      k = String(k);
      const p = this._list.find((p) => p[0] === k);
      return p ? p[1] : null;
    }
    getAll(k) {
      k = String(k);
      return this._list.filter((p) => p[0] === k).map((p) => p[1]);
    }
    has(k, v) {
      k = String(k);
      return this._list.some((p) => p[0] === k && (v === undefined || p[1] === String(v)));
    }
    set(k, v) {
      k = String(k);
      v = String(v);
      const i = this._list.findIndex((p) => p[0] === k);
      if (i < 0) this._list.push([k, v]);
      else {
        this._list[i][1] = v;
        this._list = this._list.filter((p, j) => j <= i || p[0] !== k);
      }
      this._update();
    }
    sort() {
      this._list = this._list
        .map((p, i) => [p, i])
        .sort((a, b) => (a[0][0] < b[0][0] ? -1 : a[0][0] > b[0][0] ? 1 : a[1] - b[1]))
        .map((x) => x[0]);
      this._update();
    }
    forEach(fn, thisArg) {
      for (const [k, v] of this._list) fn.call(thisArg, v, k, this);
    }
    *entries() {
      for (const p of this._list) yield [p[0], p[1]];
    }
    *keys() {
      for (const p of this._list) yield p[0];
    }
    *values() {
      for (const p of this._list) yield p[1];
    }
    [Symbol.iterator]() {
      return this.entries();
    }
    toString() {
      return this._list.map((p) => formEncode(p[0]) + '=' + formEncode(p[1])).join('&');
    }
    get [Symbol.toStringTag]() {
      return 'URLSearchParams';
    }
  }

  // ---- URL (special schemes, as the WHATWG parser treats them) ----
  const defaultPorts = { 'http:': '80', 'https:': '443', 'ws:': '80', 'wss:': '443', 'ftp:': '21' };
  // Percent-encode what the WHATWG path and query encode sets name, plus
  // anything outside printable ASCII; existing escapes are kept.
  const encodeSet = (s, extra) =>
    s.replace(/[\u0000-\u0020"<>`\u007f-\uffff]|[#?{}]/g, (c) => {
      if ((c === '?' || c === '{' || c === '}') && !extra.includes(c)) return c;
      if (c === '#' && !extra.includes(c)) return c;
      try {
        return encodeURIComponent(c);
      } catch {
        return '%EF%BF%BD';
      }
    });
  const removeDots = (path) => {
    const out = [];
    const segs = path.split('/');
    for (let i = 0; i < segs.length; i++) {
      const s = segs[i];
      const last = i === segs.length - 1;
      if (s === '..' || s.toLowerCase() === '%2e%2e') {
        if (out.length > 1) out.pop();
        if (last) out.push('');
      } else if (s === '.' || s.toLowerCase() === '%2e') {
        if (last) out.push('');
      } else out.push(s);
    }
    return out.join('/');
  };
  const parseAbsolute = (input) => {
    const m = /^([a-zA-Z][a-zA-Z0-9+.-]*):(.*)$/s.exec(input);
    if (!m) return null;
    const protocol = m[1].toLowerCase() + ':';
    let rest = m[2];
    const u = { protocol, username: '', password: '', hostname: '', port: '', path: '', query: null, fragment: null };
    const hashAt = rest.indexOf('#');
    if (hashAt >= 0) (u.fragment = rest.slice(hashAt + 1)), (rest = rest.slice(0, hashAt));
    const qAt = rest.indexOf('?');
    if (qAt >= 0) (u.query = rest.slice(qAt + 1)), (rest = rest.slice(0, qAt));
    const special = protocol in defaultPorts || protocol === 'file:';
    if (special) rest = rest.replace(/\\/g, '/');
    if (rest.startsWith('//') || (special && protocol !== 'file:')) {
      rest = rest.replace(/^\/*/, '');
      const slash = rest.indexOf('/');
      let auth = slash < 0 ? rest : rest.slice(0, slash);
      u.path = slash < 0 ? '/' : rest.slice(slash);
      const at = auth.lastIndexOf('@');
      if (at >= 0) {
        const cred = auth.slice(0, at);
        auth = auth.slice(at + 1);
        const colon = cred.indexOf(':');
        u.username = encodeSet(colon < 0 ? cred : cred.slice(0, colon), '');
        u.password = colon < 0 ? '' : encodeSet(cred.slice(colon + 1), '');
      }
      const pm = /^(\[[^\]]*\]|[^:]*)(?::(.*))?$/.exec(auth);
      u.hostname = pm[1].toLowerCase();
      if (/[\s<>^|%\/?#@\\]/.test(u.hostname)) throw new TypeError('Invalid URL: ' + input);
      if (pm[2] !== undefined && pm[2] !== '') {
        if (!/^\d+$/.test(pm[2]) || Number(pm[2]) > 65535) throw new TypeError('Invalid URL: ' + input);
        u.port = String(Number(pm[2]));
      }
      if (u.port === defaultPorts[protocol]) u.port = '';
      if (special && protocol !== 'file:' && u.hostname === '') throw new TypeError('Invalid URL: ' + input);
    } else {
      u.path = rest;
      u.opaque = !rest.startsWith('/');
    }
    if (!u.opaque) u.path = removeDots(u.path);
    return u;
  };

  class URL {
    constructor(url, base) {
      const input = String(url).trim();
      let u = parseAbsolute(input);
      if (!u) {
        if (base === undefined) throw new TypeError('Invalid URL: ' + input);
        const b = base instanceof URL ? base : new URL(base);
        if (b._opaque) throw new TypeError('Invalid URL: ' + input);
        u = {
          protocol: b.protocol,
          username: b.username,
          password: b.password,
          hostname: b.hostname,
          port: b.port,
          path: b._path,
          query: b._query,
          fragment: null,
        };
        let rest = input.replace(/\\/g, '/');
        const hashAt = rest.indexOf('#');
        if (hashAt >= 0) (u.fragment = rest.slice(hashAt + 1)), (rest = rest.slice(0, hashAt));
        if (rest.startsWith('//')) {
          u = parseAbsolute(b.protocol + input);
        } else if (rest === '') {
          // only a fragment (or nothing): keep the base's path and query
        } else {
          const qAt = rest.indexOf('?');
          let path = qAt >= 0 ? rest.slice(0, qAt) : rest;
          u.query = qAt >= 0 ? rest.slice(qAt + 1) : null;
          if (path !== '') {
            if (!path.startsWith('/')) path = b._path.slice(0, b._path.lastIndexOf('/') + 1) + path;
            u.path = removeDots(path);
          }
        }
      }
      this.protocol = u.protocol;
      this._username = u.username;
      this._password = u.password;
      this._hostname = u.hostname;
      this._port = u.port;
      this._opaque = !!u.opaque;
      this._path = u.opaque ? u.path : encodeSet(u.path, '?#');
      this._query = u.query === null ? null : encodeSet(u.query, '#');
      this._fragment = u.fragment === null ? null : encodeSet(u.fragment, '');
      this._params = new URLSearchParams(this._query || '');
      this._params[paramsOwner] = this;
    }
    static canParse(url, base) {
      try {
        new URL(url, base);
        return true;
      } catch {
        return false;
      }
    }
    get username() {
      return this._username;
    }
    set username(v) {
      this._username = encodeSet(String(v), '@:/');
    }
    get password() {
      return this._password;
    }
    set password(v) {
      this._password = encodeSet(String(v), '@:/');
    }
    get hostname() {
      return this._hostname;
    }
    set hostname(v) {
      this._hostname = String(v).toLowerCase();
    }
    get port() {
      return this._port;
    }
    set port(v) {
      v = String(v);
      this._port = v === defaultPorts[this.protocol] ? '' : v;
    }
    get host() {
      return this._hostname + (this._port ? ':' + this._port : '');
    }
    set host(v) {
      const [h, p] = String(v).split(':');
      this.hostname = h;
      if (p !== undefined) this.port = p;
    }
    get origin() {
      return this.protocol in defaultPorts ? this.protocol + '//' + this.host : 'null';
    }
    get pathname() {
      return this._path;
    }
    set pathname(v) {
      v = String(v);
      this._path = encodeSet(removeDots(v.startsWith('/') ? v : '/' + v), '?#');
    }
    get search() {
      return this._query ? '?' + this._query : '';
    }
    set search(v) {
      v = String(v);
      if (v.startsWith('?')) v = v.slice(1);
      this._query = v === '' ? null : encodeSet(v, '#');
      this._params._parse(this._query || '');
    }
    get searchParams() {
      return this._params;
    }
    get hash() {
      return this._fragment ? '#' + this._fragment : '';
    }
    set hash(v) {
      v = String(v);
      if (v.startsWith('#')) v = v.slice(1);
      this._fragment = v === '' ? null : encodeSet(v, '');
    }
    get href() {
      let s = this.protocol;
      if (!this._opaque) {
        s += '//';
        if (this._username || this._password) {
          s += this._username + (this._password ? ':' + this._password : '') + '@';
        }
        s += this.host;
      }
      s += this._path;
      if (this._query !== null) s += '?' + this._query;
      if (this._fragment !== null) s += '#' + this._fragment;
      return s;
    }
    set href(v) {
      const u = new URL(v);
      Object.assign(this, u);
      this._params[paramsOwner] = this;
    }
    toString() {
      return this.href;
    }
    toJSON() {
      return this.href;
    }
    get [Symbol.toStringTag]() {
      return 'URL';
    }
  }

  // ---- Headers ----
  const headerName = (n) => {
    n = String(n);
    if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(n)) throw new TypeError(`Invalid header name: "${n}"`);
    return n.toLowerCase();
  };
  const headerValue = (v) => String(v).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, '');

  class Headers {
    constructor(init) {
      this._map = new Map();
      if (init instanceof Headers) init.forEach((v, k) => this.append(k, v));
      else if (Array.isArray(init) || (init && typeof init[Symbol.iterator] === 'function')) {
        for (const [k, v] of init) this.append(k, v);
      } else if (init && typeof init === 'object') {
        for (const k of Object.keys(init)) this.append(k, init[k]);
      }
    }
    append(k, v) {
      k = headerName(k);
      v = headerValue(v);
      const cur = this._map.get(k);
      this._map.set(k, cur === undefined ? v : k === 'set-cookie' ? cur + '\n' + v : cur + ', ' + v);
    }
    set(k, v) {
      this._map.set(headerName(k), headerValue(v));
    }
    get(k) {
      const v = this._map.get(headerName(k));
      return v === undefined ? null : v.replace(/\n/g, ', ');
    }
    getSetCookie() {
      const v = this._map.get('set-cookie');
      return v === undefined ? [] : v.split('\n');
    }
    has(k) {
      return this._map.has(headerName(k));
    }
    delete(k) {
      this._map.delete(headerName(k));
    }
    forEach(fn, thisArg) {
      for (const [k, v] of this.entries()) fn.call(thisArg, v, k, this);
    }
    *entries() {
      for (const k of [...this._map.keys()].sort()) yield [k, this.get(k)];
    }
    *keys() {
      for (const [k] of this.entries()) yield k;
    }
    *values() {
      for (const [, v] of this.entries()) yield v;
    }
    [Symbol.iterator]() {
      return this.entries();
    }
    get [Symbol.toStringTag]() {
      return 'Headers';
    }
  }

  // ---- Request / Response (text, JSON and byte bodies) ----
  const bodyText = (body) => {
    if (body === undefined || body === null) return null;
    if (typeof body === 'string') return body;
    if (body instanceof URLSearchParams) return body.toString();
    if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) return new TextDecoder().decode(body);
    return String(body);
  };
  const bodyMixin = (C) => {
    Object.assign(C.prototype, {
      _consume() {
        if (this.bodyUsed) return Promise.reject(new TypeError('Body has already been consumed'));
        this.bodyUsed = true;
        return Promise.resolve(this._body === null ? '' : this._body);
      },
      text() {
        return this._consume();
      },
      json() {
        return this._consume().then((t) => JSON.parse(t));
      },
      arrayBuffer() {
        return this._consume().then((t) => new TextEncoder().encode(t).buffer);
      },
      bytes() {
        return this._consume().then((t) => new TextEncoder().encode(t));
      },
    });
    Object.defineProperty(C.prototype, 'body', {
      get() {
        return this._body;
      },
    });
  };

  class Request {
    constructor(input, init = {}) {
      const src = input instanceof Request ? input : null;
      this.url = src ? src.url : String(input instanceof URL ? input.href : input);
      this.method = String(init.method || (src ? src.method : 'GET')).toUpperCase();
      this.headers = new Headers(init.headers || (src ? src.headers : undefined));
      this._body = bodyText(init.body !== undefined ? init.body : src ? src._body : null);
      if ((this.method === 'GET' || this.method === 'HEAD') && this._body !== null) {
        throw new TypeError('Request with GET/HEAD method cannot have body.');
      }
      this.bodyUsed = false;
      this.signal = init.signal || null;
    }
    clone() {
      return new Request(this);
    }
  }
  bodyMixin(Request);

  class Response {
    constructor(body = null, init = {}) {
      const status = init.status === undefined ? 200 : Number(init.status);
      if (!Number.isInteger(status) || status < 200 || status > 599) {
        throw new RangeError(`Response status ${init.status} is outside 200-599`);
      }
      this.status = status;
      this.statusText = init.statusText === undefined ? '' : String(init.statusText);
      this.headers = new Headers(init.headers);
      this._body = bodyText(body);
      if (this._body !== null && !this.headers.has('content-type') && typeof body === 'string') {
        this.headers.set('content-type', 'text/plain;charset=UTF-8');
      }
      this.bodyUsed = false;
      this.type = 'default';
      this.url = init.url || '';
      this.redirected = false;
    }
    get ok() {
      return this.status >= 200 && this.status < 300;
    }
    clone() {
      return new Response(this._body, { status: this.status, statusText: this.statusText, headers: this.headers });
    }
    static json(data, init = {}) {
      const headers = new Headers(init.headers);
      if (!headers.has('content-type')) headers.set('content-type', 'application/json');
      return new Response(JSON.stringify(data), { ...init, headers });
    }
    static error() {
      throw new TypeError('Response.error() is not supported in a bot');
    }
  }
  bodyMixin(Response);

  // ---- Timers: run by the host between microtask checkpoints ----
  const timers = new Map();
  let nextTimerId = 1;
  const addTimer = (fn, delay, args, repeat) => {
    if (typeof fn !== 'function') throw new TypeError('The callback must be a function');
    const id = nextTimerId++;
    const ms = Math.max(0, Number(delay) || 0);
    timers.set(id, { fn, args, at: Date.now() + ms, every: repeat ? Math.max(ms, 1) : 0 });
    return id;
  };
  define('setTimeout', (fn, delay, ...args) => addTimer(fn, delay, args, false));
  define('setInterval', (fn, delay, ...args) => addTimer(fn, delay, args, true));
  define('setImmediate', (fn, ...args) => addTimer(fn, 0, args, false));
  define('clearTimeout', (id) => void timers.delete(id));
  define('clearInterval', (id) => void timers.delete(id));
  define('clearImmediate', (id) => void timers.delete(id));
  // __sandbot_timers fires the timers that are due (the earliest first) and
  // returns the milliseconds until the next one, or -1 when none is left.
  define('__sandbot_timers', () => {
    const now = Date.now();
    const due = [...timers.entries()].filter(([, t]) => t.at <= now).sort((a, b) => a[1].at - b[1].at || a[0] - b[0]);
    for (const [id, t] of due) {
      if (!timers.has(id)) continue; // cleared by an earlier callback
      if (t.every) t.at = now + t.every;
      else timers.delete(id);
      t.fn(...t.args);
    }
    let next = -1;
    for (const t of timers.values()) {
      const d = Math.max(0, t.at - Date.now());
      if (next < 0 || d < next) next = d;
    }
    return next;
  });

  // ---- structuredClone (plain data, Date, RegExp, Map, Set, typed arrays) ----
  const clone = (v, seen) => {
    if (typeof v !== 'object' || v === null) {
      if (typeof v === 'function' || typeof v === 'symbol') throw new TypeError(`${String(v)} could not be cloned`);
      return v;
    }
    if (seen.has(v)) return seen.get(v);
    let out;
    if (v instanceof Date) out = new Date(v.getTime());
    else if (v instanceof RegExp) out = new RegExp(v.source, v.flags);
    else if (v instanceof ArrayBuffer) out = v.slice(0);
    else if (ArrayBuffer.isView(v)) out = new v.constructor(v);
    else if (v instanceof Map) {
      out = new Map();
      seen.set(v, out);
      for (const [k, x] of v) out.set(clone(k, seen), clone(x, seen));
      return out;
    } else if (v instanceof Set) {
      out = new Set();
      seen.set(v, out);
      for (const x of v) out.add(clone(x, seen));
      return out;
    } else {
      out = Array.isArray(v) ? [] : {};
      seen.set(v, out);
      for (const k of Object.keys(v)) out[k] = clone(v[k], seen);
      return out;
    }
    seen.set(v, out);
    return out;
  };

  define('TextEncoder', TextEncoder);
  define('TextDecoder', TextDecoder);
  define('URL', URL);
  define('URLSearchParams', URLSearchParams);
  define('Headers', Headers);
  define('Request', Request);
  define('Response', Response);
  define('structuredClone', (v) => clone(v, new Map()));
})(globalThis);
