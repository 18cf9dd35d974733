// An HL7 v2 bot in the reference platform's style: event.input is an
// Hl7Message (the request's Content-Type is x-application/hl7-v2+er7), and
// the bot answers the message's ACK, which goes back as HL7 text.
exports.handler = async function handler(medplum, event) {
  const message = event.input;
  if (!(message instanceof Hl7Message)) {
    throw new Error('Expected an HL7 v2 message (Content-Type: x-application/hl7-v2+er7)');
  }
  const pid = message.getSegment('PID');
  console.log('ACK for', message.getSegment('MSH').getField(10).toString(), 'patient', pid?.getComponent(5, 1) ?? '(none)');
  return message.buildAck();
};
