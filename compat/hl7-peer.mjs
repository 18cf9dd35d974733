// The reference's own MLLP listener, as the peer of BenchmarkHL7Feed
// (internal/handlers/fhirapi): @medplum/hl7's Hl7Server answering each
// message with its AA, built from memory. Nothing is kept, nothing runs: the
// ceiling of a listener that acknowledges before it has done anything.
//
//   node hl7-peer.mjs <port>     (prints "listening" when ready)
globalThis.WebSocket ??= class WebSocket {};
const { Hl7Server } = await import('@medplum/hl7');

const port = Number(process.argv[2]);
const server = new Hl7Server((connection) => {
  connection.addEventListener('message', ({ message }) => connection.send(message.buildAck()));
});
await server.start(port);
console.log('listening');
