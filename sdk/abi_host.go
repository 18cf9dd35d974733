//go:build !wasip1

package sdk

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// Outside wasip1 there is no host: logs go to stderr and FHIR requests to a
// transport set by SetFHIRTransport, so that a bot can be unit tested with
// Invoke.

var (
	fhirMu        sync.Mutex
	fhirTransport func(request []byte) []byte
)

// SetFHIRTransport sets, outside wasip1, the function that answers FHIR
// requests (request and response JSON as in ABI.md). Nil restores the
// default, which answers status 501.
func SetFHIRTransport(t func(request []byte) []byte) {
	fhirMu.Lock()
	fhirTransport = t
	fhirMu.Unlock()
}

func hostLog(level Level, msg string) {
	fmt.Fprintf(os.Stderr, "[%d] %s\n", level, msg)
}

func hostFHIR(req []byte) []byte {
	fhirMu.Lock()
	t := fhirTransport
	fhirMu.Unlock()
	if t == nil {
		return []byte(`{"status":501,"body":{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"not-supported","details":{"text":"no FHIR transport"}}]}}`)
	}
	return t(req)
}

func serveCommand() {
	event, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdk: reading the event:", err)
		os.Exit(1)
	}
	os.Stdout.Write(invoke(event))
}
