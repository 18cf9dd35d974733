// hello is the smallest Go bot: JSON in, JSON out.
//
//	{"name": "Ada"}  ->  {"greeting": "Hello, Ada"}
//
// Build (a reactor module): GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o hello.wasm .
package main

import (
	"strings"

	"github.com/sandbot/sandbot/sdk"
)

func main() {} // not called in a -buildmode=c-shared module

func init() {
	sdk.Handle(hello)
}

func hello(ctx sdk.Context, e sdk.Event) (any, error) {
	var in struct {
		Name string `json:"name"`
	}
	if err := e.JSON(&in); err != nil {
		return nil, sdk.Errorf(400, "expected a JSON object with a name: %v", err)
	}
	name := strings.TrimSpace(in.Name)
	if name == "" {
		name = "world"
	}
	sdk.Logf("greeting %s", name)
	return map[string]string{"greeting": "Hello, " + name}, nil
}
