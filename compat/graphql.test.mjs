// FHIR GraphQL through the official @medplum/core client: requestSchema (the
// StructureDefinition and SearchParameters of a type, which every form and
// list of @medplum/react loads first), graphql queries with references
// resolved, and searchResources with parameters the schema then knows.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { startServer } from './server.mjs';

// @medplum/core 5.x references the global WebSocket at load time.
globalThis.WebSocket ??= class WebSocket {};
const { MedplumClient, getDataType, isDataTypeLoaded, globalSchema } = await import('@medplum/core');

let server;
let medplum;

before(async () => {
  server = await startServer();
  medplum = new MedplumClient({ baseUrl: server.baseUrl, fetch });
  await medplum.startClientLogin(server.clientId, server.clientSecret);
});

after(async () => {
  await server?.stop();
});

test('requestSchema loads a type and its search parameters through $graphql', async () => {
  assert.equal(isDataTypeLoaded('Observation'), false);
  await medplum.requestSchema('Observation');
  assert.equal(isDataTypeLoaded('Observation'), true);
  const observation = getDataType('Observation');
  assert.ok(observation.elements.subject, 'Observation.subject');
  assert.ok(observation.elements['value[x]'], 'Observation.value[x]');
  assert.ok(globalSchema.types.Observation.searchParams?.subject, 'the subject search parameter');
  assert.ok(globalSchema.types.Observation.searchParams?.['value-quantity'], 'value-quantity');
});

test('graphql: a list with its references resolved, as the caller may see them', async () => {
  const family = `Gql${randomUUID().slice(0, 8)}`;
  const patient = await medplum.createResource({ resourceType: 'Patient', name: [{ given: ['Ada'], family }] });
  await medplum.createResource({
    resourceType: 'DiagnosticReport', status: 'final', code: { text: 'panel' }, subject: { reference: `Patient/${patient.id}` },
  });
  const result = await medplum.graphql(`{
    DiagnosticReportList(subject: "Patient/${patient.id}") {
      id status subject { reference resource { ... on Patient { id name { given family } } } }
    }
    PatientList(family: "${family}") { id }
  }`);
  assert.equal(result.errors, undefined);
  assert.equal(result.data.DiagnosticReportList.length, 1);
  assert.equal(result.data.DiagnosticReportList[0].subject.resource.name[0].family, family);
  assert.deepEqual(result.data.PatientList, [{ id: patient.id }]);
  await assert.rejects(medplum.graphql('{ PatientList { nope } }'), /Cannot query field/);
  // searchResources with parameters of the definitions' table (DiagnosticReport?subject).
  const reports = await medplum.searchResources('DiagnosticReport', { subject: `Patient/${patient.id}`, _sort: '-_lastUpdated' });
  assert.equal(reports.length, 1);
});
