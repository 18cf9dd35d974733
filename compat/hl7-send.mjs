// Sends HL7 messages to an MLLP listener with @medplum/hl7's Hl7Client (the
// reference's own client, which `medplum hl7 send` uses) on one connection,
// waiting for each ACK, and prints "<MSA-1> <MSA-2>" per message.
//
//   node hl7-send.mjs <host> <port> <file.hl7>...
//
// Used by internal/handlers/fhirapi's TestHL7FeedWithMedplumHl7Client.
import { readFileSync } from 'node:fs';

globalThis.WebSocket ??= class WebSocket {};
const { Hl7Message } = await import('@medplum/core');
const { Hl7Client } = await import('@medplum/hl7');

const [host, port, ...files] = process.argv.slice(2);
const client = new Hl7Client({ host, port: Number(port) });
try {
  for (const file of files) {
    const msg = Hl7Message.parse(readFileSync(file, 'utf8').trim());
    // 'first': an enhanced-mode commit ACK (CA) is the answer; the client's
    // default waits for an application ACK after it, which sandbot sends
    // only on a channel in application mode (the bot's own ACK).
    const ack = await client.sendAndWait(msg, { timeoutMs: 20_000, returnAck: 'first' });
    const msa = ack.getSegment('MSA');
    console.log(`${msa.getField(1).toString()} ${msa.getField(2).toString()}`);
  }
} finally {
  await client.close();
}
// The client leaves each answered message's timeout timer running (it clears
// it only on close with the message pending): do not wait for them.
process.exit(0);
