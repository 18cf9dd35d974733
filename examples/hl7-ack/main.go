// hl7-ack acknowledges an HL7 v2 message: it answers an x-application/hl7-v2+er7
// request with an ACK (MSA-1 AA) built by the hl7 package, in the message's
// own delimiters; the server returns it with the request's content type.
//
// Build (a reactor module): GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o hl7-ack.wasm .
package main

import (
	"github.com/sandbot/sandbot/sdk"
	"github.com/sandbot/sandbot/sdk/hl7"
)

func main() {}

func init() {
	sdk.Handle(ack)
}

func ack(ctx sdk.Context, e sdk.Event) (any, error) {
	msg, err := e.HL7()
	if err != nil {
		return nil, sdk.Errorf(400, "not an HL7 v2 message: %v", err)
	}
	sdk.Logf("received %s^%s control id %s", msg.Type(), msg.Trigger(), msg.ControlID())
	a, err := msg.Ack(hl7.AckOptions{Code: "AA", Text: "Message accepted"})
	if err != nil {
		return nil, err
	}
	return a.String(), nil
}
