//go:build !wasip1

package sdk

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func withHandler(t *testing.T, h Handler) {
	old := handler
	handler = h
	t.Cleanup(func() { handler = old })
}

func TestEnvelopes(t *testing.T) {
	cases := []struct {
		v    any
		err  error
		want string
	}{
		{map[string]int{"a": 1}, nil, `{"result":{"a":1}}`},
		{nil, nil, `{}`},
		{0, nil, `{"result":0}`},
		{"", nil, `{"result":""}`},
		{[]byte("text"), nil, `{"result":"text"}`},
		{json.RawMessage(`[1]`), nil, `{"result":[1]}`},
		{Response{Status: 201, ContentType: "text/plain", Body: "made"}, nil, `{"result":"made","status":201,"contentType":"text/plain"}`},
		{&Response{Body: 1}, nil, `{"result":1}`},
		{WithStatus(202, "ok"), nil, `{"result":"ok","status":202}`},
		{WithContentType("text/csv", "a,b"), nil, `{"result":"a,b","contentType":"text/csv"}`},
		{nil, errors.New("boom"), `{"error":"boom"}`},
		{nil, Errorf(404, "no %s", "thing"), `{"error":"no thing","status":404}`},
		{nil, &Error{Outcome: Resource{"resourceType": "OperationOutcome"}}, `{"error":{"resourceType":"OperationOutcome"}}`},
	}
	for _, c := range cases {
		if got := string(buildEnvelope(c.v, c.err)); got != c.want {
			t.Errorf("%#v, %v: got %s want %s", c.v, c.err, got, c.want)
		}
	}
}

func TestAccessors(t *testing.T) {
	ev := func(ct, input string) Event {
		var e Event
		if err := json.Unmarshal([]byte(`{"contentType":"`+ct+`","input":`+input+`,"secrets":{"K":{"name":"K","valueString":"v"}},"headers":{"x-a":"b"}}`), &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	if s, err := ev(TextPlain, `"hi"`).Text(); err != nil || s != "hi" {
		t.Fatalf("text %q %v", s, err)
	}
	if _, err := ev(JSONType, `{}`).Text(); err == nil {
		t.Fatal("object as text")
	}
	var v struct{ A int }
	if err := ev(JSONType, `{"A":3}`).JSON(&v); err != nil || v.A != 3 {
		t.Fatalf("json %v %v", v, err)
	}
	f, err := ev(FormType, `{"a":"1","b":["2","3"]}`).Form()
	if err != nil || f.Get("a") != "1" || len(f["b"]) != 2 {
		t.Fatalf("form %v %v", f, err)
	}
	r, err := ev(FHIRJSON, `{"resourceType":"Patient","id":"x"}`).Resource()
	if err != nil || r.ResourceType() != "Patient" || r.ID() != "x" {
		t.Fatalf("resource %v %v", r, err)
	}
	if _, err := ev(JSONType, `{"id":"x"}`).Resource(); err == nil {
		t.Fatal("resource without resourceType")
	}
	m, err := ev(HL7Type, `"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|X1|P|2.5\rPID|1\r"`).HL7()
	if err != nil || m.ControlID() != "X1" || m.Type() != "ADT" {
		t.Fatalf("hl7 %v", err)
	}
	e := ev(JSONType, `null`)
	if err := e.JSON(&v); !errors.Is(err, ErrNoInput) {
		t.Fatalf("no input: %v", err)
	}
	if e.Secret("K") != "v" || e.Header("x-a") != "b" {
		t.Fatal("secret/header")
	}
}

func TestInvoke(t *testing.T) {
	withHandler(t, func(ctx Context, e Event) (any, error) {
		p, err := ctx.FHIR().Read("Patient", "1")
		if err != nil {
			return nil, err
		}
		return p, nil
	})
	SetFHIRTransport(func(req []byte) []byte {
		if string(req) != `{"method":"GET","url":"Patient/1"}` {
			return []byte(`{"status":400}`)
		}
		return []byte(`{"status":200,"body":{"resourceType":"Patient","id":"1"}}`)
	})
	defer SetFHIRTransport(nil)
	if got := string(Invoke([]byte(`{"contentType":"application/json"}`))); got != `{"result":{"id":"1","resourceType":"Patient"}}` {
		t.Fatalf("got %s", got)
	}
	SetFHIRTransport(nil)
	got := string(Invoke([]byte(`{}`)))
	if !strings.Contains(got, "status 501") {
		t.Fatalf("got %s", got)
	}
}

func TestInvokePanic(t *testing.T) {
	withHandler(t, func(ctx Context, e Event) (any, error) { panic("oops") })
	if got := string(Invoke([]byte(`{}`))); got != `{"error":"bot panicked: oops"}` {
		t.Fatalf("got %s", got)
	}
	if got := string(Invoke([]byte(`nope`))); !strings.Contains(got, "invalid event") {
		t.Fatalf("got %s", got)
	}
}

func TestFHIRSearch(t *testing.T) {
	SetFHIRTransport(func(req []byte) []byte {
		return []byte(`{"status":200,"body":{"resourceType":"Bundle","entry":[{"resource":{"resourceType":"Patient","id":"a"},"search":{"mode":"match"}},{"resource":{"resourceType":"OperationOutcome"},"search":{"mode":"outcome"}}]}}`)
	})
	defer SetFHIRTransport(nil)
	rs, err := (&FHIRClient{}).Search("Patient", "name=x")
	if err != nil || len(rs) != 1 || rs[0].ID() != "a" {
		t.Fatalf("%v %v", rs, err)
	}
	SetFHIRTransport(func(req []byte) []byte {
		return []byte(`{"status":404,"body":{"resourceType":"OperationOutcome","issue":[{"details":{"text":"gone"}}]}}`)
	})
	_, err = (&FHIRClient{}).Read("Patient", "a")
	var fe *FHIRError
	if !errors.As(err, &fe) || fe.Status != 404 || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("%v", err)
	}
}

func TestFHIRConditional(t *testing.T) {
	var got []string
	SetFHIRTransport(func(req []byte) []byte {
		got = append(got, string(req))
		return []byte(`{"status":200,"body":{"resourceType":"Patient","id":"a"}}`)
	})
	defer SetFHIRTransport(nil)
	c := &FHIRClient{}
	p := map[string]any{"resourceType": "Patient"}
	if r, err := c.CreateIfNoneExist(p, "?identifier=s|1"); err != nil || r.ID() != "a" {
		t.Fatalf("CreateIfNoneExist: %v %v", r, err)
	}
	if r, err := c.Upsert(p, "identifier=s|1"); err != nil || r.ID() != "a" {
		t.Fatalf("Upsert: %v %v", r, err)
	}
	want := []string{
		`{"method":"POST","url":"Patient","body":{"resourceType":"Patient"},"ifNoneExist":"identifier=s|1"}`,
		`{"method":"PUT","url":"Patient?identifier=s|1","body":{"resourceType":"Patient"}}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
