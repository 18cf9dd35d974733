package hl7feed

import (
	"net"
	"strings"
	"testing"
)

func TestParseListeners(t *testing.T) {
	ls, err := ParseListeners(" :2575=p1;10.0.0.0/8;192.168.1.0/24 , 127.0.0.1:2576=p2,")
	if err != nil || len(ls) != 2 {
		t.Fatalf("%v %v", ls, err)
	}
	if ls[0].Addr != ":2575" || ls[0].Project != "p1" || len(ls[0].Allow) != 2 || ls[1].Addr != "127.0.0.1:2576" || ls[1].Project != "p2" || ls[1].Allow != nil {
		t.Errorf("%+v", ls)
	}
	if !ls[0].allowed(net.ParseIP("10.1.2.3")) || ls[0].allowed(net.ParseIP("172.16.0.1")) || !ls[1].allowed(net.ParseIP("172.16.0.1")) {
		t.Error("allowed networks")
	}
	if ls, err := ParseListeners(""); err != nil || ls != nil {
		t.Errorf("empty: %v %v", ls, err)
	}
	for in, want := range map[string]string{
		":2575":               "ADDR=PROJECT",
		"2575=p":              "missing port",
		":2575=p;10.0.0.0":    "10.0.0.0",
		":2575=p,:2575=q":     "given twice",
		"=p":                  "ADDR=PROJECT",
		":2575=p;not-a-cidr/": "not-a-cidr",
		":2575=p;cert=a.pem":  "both cert= and key=",
		":2575=p;ciphers=x":   "cert=, key= or clientca=",
		":2575=p;cert=/nonexistent/c.pem;key=/nonexistent/k.pem": "no such file",
	} {
		if _, err := ParseListeners(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
