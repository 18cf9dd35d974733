// Package examples holds the example bots (each in its own directory and Go
// module, built to a committed .wasm by the Makefile) and the tests that
// run those modules through the runtime package.
package examples
