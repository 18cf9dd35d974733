// Builds dist/index.js from src/index.ts the way the reference platform's bot
// projects do (its examples' esbuild script): bundled, CommonJS, for Node,
// @medplum/core left external (a bot's runtime provides it).
//
//   npx esbuild@0.28.2 ... (or: node esbuild-script.mjs, with esbuild installed)
//
// compat/cli.test.mjs builds this example with these options and deploys the
// result with the official CLI.
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

export const options = {
  entryPoints: [path.join(here, 'src', 'index.ts')],
  outfile: path.join(here, 'dist', 'index.js'),
  bundle: true,
  platform: 'node',
  format: 'cjs',
  target: 'es2020',
  external: ['@medplum/core'],
  logLevel: 'warning',
};

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const esbuild = await import('esbuild');
  await esbuild.build(options);
}
