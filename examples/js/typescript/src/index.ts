// A TypeScript bot as the reference platform's projects write them: typed
// against @medplum/core, compiled by esbuild to CommonJS with @medplum/core
// left external (the runtime provides it). Input: a Patient; output: the
// Patient's display name and an Observation recording that the bot saw it,
// created through the bot's MedplumClient.
import { BotEvent, MedplumClient, createReference, formatHumanName, getReferenceString } from '@medplum/core';

interface Resource {
  resourceType: string;
  id?: string;
}

interface Patient extends Resource {
  resourceType: 'Patient';
  name?: { given?: string[]; family?: string }[];
}

export async function handler(medplum: MedplumClient, event: BotEvent<Patient>): Promise<{ name: string; observation: string }> {
  const patient = event.input;
  if (patient?.resourceType !== 'Patient') {
    throw new Error('Expected a Patient');
  }
  const saved = patient.id ? patient : await medplum.createResource(patient);
  const name = patient.name?.[0] ? formatHumanName(patient.name[0] as never) : '(no name)';
  const observation = await medplum.createResource({
    resourceType: 'Observation',
    status: 'final',
    code: { text: 'Seen by the TypeScript bot' },
    subject: createReference(saved as never),
    valueString: name,
  } as never);
  console.log('observed', getReferenceString(saved as never));
  return { name, observation: getReferenceString(observation as never) };
}
