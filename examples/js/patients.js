// A bot that works through its MedplumClient, in the reference platform's
// style: {"given":"Ada","family":"Lovelace"} creates that Patient and answers
// the Patients with that family name. It runs as the bot's own project
// membership; no token enters the sandbox.
const { createReference, getReferenceString, OperationOutcomeError, badRequest } = require('@medplum/core');

exports.handler = async function handler(medplum, event) {
  const { given, family } = event.input ?? {};
  if (!family) {
    throw new OperationOutcomeError(badRequest('family is required'));
  }
  const patient = await medplum.createResource({
    resourceType: 'Patient',
    name: [{ given: given ? [given] : [], family }],
  });
  console.log('created', getReferenceString(patient));
  const found = await medplum.searchResources('Patient', { family });
  return {
    created: createReference(patient),
    found: found.map((p) => getReferenceString(p)),
  };
};
