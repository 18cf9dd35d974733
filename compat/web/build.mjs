// Builds the test page (app/) into outDir with Vite; used by the browser test
// and runnable alone: node build.mjs [outDir].
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'vite';

const here = path.dirname(fileURLToPath(import.meta.url));

export async function buildPage(outDir) {
  await build({
    root: path.join(here, 'app'),
    base: './',
    logLevel: 'warn',
    configFile: false,
    esbuild: { jsx: 'automatic' },
    build: {
      outDir,
      emptyOutDir: true,
      sourcemap: false,
      minify: false,
      reportCompressedSize: false,
      chunkSizeWarningLimit: 100000,
      rollupOptions: {
        // Mantine marks its modules "use client" (for React server
        // components); a browser bundle has nothing to do with it.
        onwarn(warning, warn) {
          if (warning.code !== 'MODULE_LEVEL_DIRECTIVE') warn(warning);
        },
      },
    },
  });
  return outDir;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await buildPage(path.resolve(process.argv[2] ?? path.join(here, 'dist')));
}
