// A JavaScript bot in the reference platform's style (CommonJS, as its
// example projects' esbuild script emits): {"name":"Ada"} -> {"greeting":"Hello, Ada"}.
exports.handler = async function handler(medplum, event) {
  const name = String(event.input?.name ?? '').trim() || 'world';
  console.log('greeting', name);
  return { greeting: 'Hello, ' + name };
};
