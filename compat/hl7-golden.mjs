// Generates sdk/hl7/testdata/medplum-golden.json: what @medplum/core's Hl7Message
// returns for every field of every message of the HL7 corpus
// (sdk/hl7/testdata/corpus), for the differential test in sdk/hl7/corpus_test.go
// (TestMedplumDifferential).
//
// Run: cd compat && node hl7-golden.mjs
//
// Per segment it records "NAME nfields hash": nfields is the highest n for
// which getField(n) exists (HL7 numbering, MSH-1 = field separator), hash the
// FNV-1a 64 (hex) of getField(1..n).toString() joined by NUL, over the bytes.
// Files are read as latin1 so that every byte maps to one character and back.
//
// Medplum only parses single messages that start with "MSH". To feed it the
// same messages our ParseBatch finds, the script strips a UTF-8 BOM and MLLP
// framing, and splits files with envelopes (FHS/BHS/BTS/FTS) or several MSH
// into messages: a line starting with MSH opens a message, envelope lines close
// it, and each message's lines are joined with CR. Files that medplum rejects
// are recorded with their error.
import { readFileSync, readdirSync, statSync, writeFileSync, mkdirSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

// @medplum/core 5.x references the global WebSocket at load time, which
// Node 20 only has behind --experimental-websocket; a stub is enough here.
globalThis.WebSocket ??= class WebSocket {};
const { Hl7Message } = await import('@medplum/core');

// The corpus kept in the repository (sdk/hl7/testdata/corpus, with its origins
// and licences); HL7_CORPUS points elsewhere.
const corpus = process.env.HL7_CORPUS ?? fileURLToPath(new URL('../sdk/hl7/testdata/corpus/', import.meta.url));
const out = '../sdk/hl7/testdata/medplum-golden.json';

function walk(dir) {
  const files = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) files.push(...walk(p));
    else if (name.endsWith('.hl7')) files.push(p);
  }
  return files;
}

const MASK = (1n << 64n) - 1n;
const PRIME = 1099511628211n;
function fnv(h, s) {
  for (let i = 0; i < s.length; i++) {
    h ^= BigInt(s.charCodeAt(i) & 0xff);
    h = (h * PRIME) & MASK;
  }
  return h;
}

// stripFraming removes a UTF-8 BOM (as latin1 chars) and MLLP framing.
export function stripFraming(text) {
  if (text.startsWith('\xEF\xBB\xBF')) text = text.slice(3);
  if (text.startsWith('\x0B')) {
    const end = text.indexOf('\x1C');
    text = text.slice(1, end < 0 ? undefined : end);
    if (text.startsWith('\xEF\xBB\xBF')) text = text.slice(3);
  }
  return text;
}

// splitMessages returns the texts of the messages in a file.
export function splitMessages(text) {
  const lines = text.split(/[\r\n]+/);
  const mshCount = lines.filter((l) => l.startsWith('MSH')).length;
  const envelope = lines.some((l) => ['FHS', 'BHS', 'BTS', 'FTS'].includes(l.slice(0, 3)));
  if (text.startsWith('MSH') && mshCount === 1 && !envelope) return [text];
  const msgs = [];
  let cur = null;
  for (const line of lines) {
    const name = line.slice(0, 3);
    if (['FHS', 'BHS', 'BTS', 'FTS'].includes(name)) {
      cur = null;
    } else if (name === 'MSH') {
      cur = [line];
      msgs.push(cur);
    } else if (cur && line !== '') {
      cur.push(line);
    }
  }
  if (msgs.length === 0) return [text]; // let medplum reject it
  return msgs.map((m) => m.join('\r'));
}

function describe(msg) {
  const segments = [];
  for (const seg of msg.segments) {
    const raw = seg.toString();
    if (raw === '') continue; // the empty string after a trailing terminator
    const n = seg.name === 'MSH' ? seg.fields.length : seg.fields.length - 1;
    let h = 14695981039346656037n;
    for (let i = 1; i <= n; i++) {
      if (i > 1) h = fnv(h, '\0');
      const f = seg.getField(i);
      h = fnv(h, f === undefined ? '' : f.toString());
    }
    segments.push(`${seg.name} ${n} ${h.toString(16).padStart(16, '0')}`);
  }
  return { segments };
}

// Inputs behind each deliberate difference listed in sdk/hl7/DIFFERENCES.md; the
// Go test TestDifferences checks that medplum behaves as the document says
// and that our package behaves differently in the documented way.
export const differenceCases = {
  bom: '\xEF\xBB\xBFMSH|^~\\&|A|B\rPID|1\r',
  mllp: '\x0BMSH|^~\\&|A|B\rPID|1\r\x1C\r',
  batch: 'BHS|^~\\&\rMSH|^~\\&|A|B\rPID|1\rBTS|1\r',
  severalMSH: 'MSH|^~\\&|A|1\rPID|1\rMSH|^~\\&|A|2\rPID|2\r',
  escapes: 'MSH|^~\\&|A\rOBX|1|ST|||a\\S\\b\\.br\\c^d\r',
  lfBlankLines: 'MSH|^~\\&|A\nPID|1\n\nOBX|1\n',
  shortMSH2: 'MSH|^~}|A|B\rPID|1||x&y\r',
  longSegmentName: 'MSH|^~\\&|A\rPLATEL|x\r',
  lowercaseSegment: 'MSH|^~\\&|A\rpid|1\r',
  leadingBlankLine: '\r\nMSH|^~\\&|A\r',
  whitespaceLine: 'MSH|^~\\&|A\r   \rPID|1\r',
  ack: 'MSH|^~\\&|S|SF|R|RF|2024||ADT^A01|C1|T|2.3\r',
  setEscapes: 'MSH|^~\\&|A\rPID|1\r',
};

function medplumCase(name, text) {
  let msg;
  try {
    msg = Hl7Message.parse(text);
  } catch (err) {
    return { error: String(err.message ?? err) };
  }
  const r = {
    segments: msg.segments.map((seg) => {
      const n = seg.name === 'MSH' ? seg.fields.length : seg.fields.length - 1;
      const fields = [];
      for (let i = 0; i <= n; i++) fields.push(seg.getField(i)?.toString() ?? '');
      return fields;
    }),
  };
  if (name === 'escapes') r.component1 = msg.getSegment('OBX').getComponent(5, 1);
  if (name === 'shortMSH2') r.subcomponentSeparator = msg.context.subcomponentSeparator;
  if (name === 'lfBlankLines') {
    msg.getSegment('PID').setField(1, '2');
    r.afterEdit = msg.toString();
  }
  if (name === 'setEscapes') {
    msg.getSegment('PID').setField(2, 'a|b^c');
    r.afterEdit = msg.toString();
  }
  if (name === 'ack') {
    const ack = msg.buildAck({ ackCode: 'AE' });
    r.ackMSH9 = ack.getSegment('MSH').getField(9).toString();
    r.ackMSH11 = ack.getSegment('MSH').getField(11).toString();
    r.ackMSH12 = ack.getSegment('MSH').getField(12).toString();
    r.ackMSA3 = ack.getSegment('MSA').getField(3).toString();
  }
  return r;
}

function main() {
  const version = JSON.parse(readFileSync('node_modules/@medplum/core/package.json', 'utf8')).version;
  const result = { generator: `compat/hl7-golden.mjs with @medplum/core ${version}`, files: {} };
  for (const p of walk(corpus)) {
    const name = relative(corpus, p).split(sep).join('/');
    const text = stripFraming(readFileSync(p, 'latin1'));
    const entry = {};
    try {
      entry.messages = splitMessages(text).map((t) => describe(Hl7Message.parse(t)));
    } catch (err) {
      entry.error = String(err.message ?? err);
      delete entry.messages;
    }
    result.files[name] = entry;
  }
  result.differences = {};
  for (const [name, text] of Object.entries(differenceCases)) {
    result.differences[name] = { input: text, medplum: medplumCase(name, text) };
  }
  mkdirSync('../sdk/hl7/testdata', { recursive: true });
  writeFileSync(out, JSON.stringify(result, null, 0).replaceAll('},"', '},\n"') + '\n');
  console.log(`wrote ${out}: ${Object.keys(result.files).length} files`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) main();
