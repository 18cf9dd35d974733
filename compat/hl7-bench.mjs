// Times @medplum/core's Hl7Message on the same inputs as the Go benchmarks in
// sdk/hl7/bench_test.go, the same way, and prints MB/s:
//
//   parse        Hl7Message.parse of every corpus message    (BenchmarkParse)
//   parse+get3   parse, then PID-3, PID-5.1 and MSH-10        (BenchmarkParseGet3)
//   toString     toString of every parsed, unedited message  (BenchmarkSerialize)
//   edit+toString parse, set MSH-10, toString                (BenchmarkEditSerialize)
//   parseLarge   parse of a generated ORU with 5,000 OBX     (BenchmarkParseLarge)
//
// Run: cd compat && node hl7-bench.mjs   (optionally BENCH_SECONDS=2)
//
// Messages: every *.hl7 of the corpus except the deliberately bad ones
// ("bad" in the name, InvalidMessage.hl7), read as latin1 (one char per byte,
// so MB/s are over the same bytes as in Go), BOM stripped, batch files split
// into messages with splitMessages from hl7-golden.mjs.
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stripFraming, splitMessages } from './hl7-golden.mjs';

globalThis.WebSocket ??= class WebSocket {};
const { Hl7Message } = await import('@medplum/core');

// The corpus kept in the repository (sdk/hl7/testdata/corpus, with its origins
// and licences); HL7_CORPUS points elsewhere.
const corpus = process.env.HL7_CORPUS ?? fileURLToPath(new URL('../sdk/hl7/testdata/corpus/', import.meta.url));
const seconds = Number(process.env.BENCH_SECONDS ?? 2);

function walk(dir) {
  const files = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) files.push(...walk(p));
    else if (name.endsWith('.hl7')) files.push(p);
  }
  return files;
}

function largeORU(n) {
  const parts = [
    'MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01^ORU_R01|MSG00001|P|2.5.1\r',
    'PID|1||123456^^^HOSP^MR~987654^^^STATE^SS||DOE^JOHN^Q||19700101|M\r',
    'OBR|1|ORD1|FIL1|CBC^Complete blood count^L|||20240101110000\r',
  ];
  for (let i = 1; i <= n; i++) {
    parts.push(
      `OBX|${i}|NM|718-7^Hemoglobin^LN|1|13.${i % 10}|g/dL^grams per deciliter^UCUM|12.0-17.5|N|||F|||20240101120000\r`
    );
  }
  return parts.join('');
}

let sink = 0;

function bench(name, bytes, fn) {
  const deadline = (ms) => performance.now() + ms;
  let end = deadline(Math.min(1000, seconds * 500)); // warm-up
  while (performance.now() < end) fn();
  let iters = 0;
  const start = performance.now();
  end = start + seconds * 1000;
  let now = start;
  while (now < end) {
    fn();
    iters++;
    now = performance.now();
  }
  const secs = (now - start) / 1000;
  const mbs = (bytes * iters) / secs / 1e6;
  console.log(`${name.padEnd(14)} ${mbs.toFixed(1).padStart(9)} MB/s  (${iters} iterations, ${((secs / iters) * 1e6).toFixed(0)} us/op)`);
  return mbs;
}

const msgs = [];
for (const p of walk(corpus)) {
  const name = relative(corpus, p).split(sep).join('/');
  if (name.includes('bad') || name.includes('InvalidMessage')) continue;
  msgs.push(...splitMessages(stripFraming(readFileSync(p, 'latin1'))));
}
const total = msgs.reduce((n, m) => n + m.length, 0);
console.log(`@medplum/core Hl7Message, node ${process.version}: ${msgs.length} messages, ${total} bytes`);

bench('parse', total, () => {
  for (const t of msgs) sink += Hl7Message.parse(t).context.fieldSeparator.length;
});

bench('parse+get3', total, () => {
  for (const t of msgs) {
    const m = Hl7Message.parse(t);
    const pid = m.getSegment('PID');
    sink += (pid?.getField(3)?.toString() ?? '').length;
    sink += (pid?.getComponent(5, 1) ?? '').length;
    sink += (m.getSegment('MSH')?.getField(10)?.toString() ?? '').length;
  }
});

const parsed = msgs.map((t) => Hl7Message.parse(t));
bench('toString', total, () => {
  for (const m of parsed) sink += m.toString().length;
});

bench('edit+toString', total, () => {
  for (const t of msgs) {
    const m = Hl7Message.parse(t);
    m.getSegment('MSH').setField(10, 'EDITED-42');
    sink += m.toString().length;
  }
});

const large = largeORU(5000);
bench('parseLarge', large.length, () => {
  sink += Hl7Message.parse(large).context.fieldSeparator.length;
});

if (sink === 42) console.log('');
