package webhook_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/webhook"
)

func TestRefusesInsideAddresses(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':'):]
	c := webhook.New(webhook.Config{Timeout: 2 * time.Second})
	for _, u := range []string{
		srv.URL,                                    // loopback by address
		"http://localhost" + port,                  // loopback by name
		"http://[::ffff:127.0.0.1]" + port,         // loopback mapped into IPv6
		"http://169.254.169.254/latest/meta-data/", // the cloud metadata service
		"http://10.1.2.3/", "http://192.168.0.1/", "http://172.16.0.1/", "http://100.64.0.1/",
		"http://0.0.0.0" + port, "http://[::1]" + port, "http://[fd00::1]/",
	} {
		_, err := c.Post(context.Background(), u, []byte("{}"), nil)
		if !errors.Is(err, webhook.ErrRefusedAddress) {
			t.Errorf("%s: %v, want the address refused", u, err)
		}
	}
	if hits != 0 {
		t.Fatalf("the server was reached %d times", hits)
	}
	for _, u := range []string{"ftp://example.com/", "http://user:pw@example.com/", "file:///etc/passwd", "/relative"} {
		if _, err := c.Post(context.Background(), u, nil, nil); err == nil || errors.Is(err, webhook.ErrRefusedAddress) {
			t.Errorf("%s: %v, want the URL refused", u, err)
		}
	}
}

func TestAllowedRangeAndRedirects(t *testing.T) {
	var got http.Header
	var body string
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		w.WriteHeader(202)
	}))
	defer target.Close()
	redirect := func(to string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, to, http.StatusTemporaryRedirect)
		}))
	}
	allow, err := webhook.ParseAllow("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c := webhook.New(webhook.Config{Allow: allow, Timeout: 2 * time.Second})
	status, err := c.Post(context.Background(), target.URL, []byte(`{"a":1}`), []webhook.Header{{"X-Signature", "abc"}, {"Bad\r\nName", "x"}})
	if err != nil || status != 202 {
		t.Fatalf("allowed call: %d %v", status, err)
	}
	if got.Get("X-Signature") != "abc" || body != `{"a":1}` {
		t.Fatalf("headers %v body %q", got, body)
	}
	// A redirect from an allowed address to the metadata service, or to a
	// private one, is refused when it is followed.
	for _, to := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://[::1]:1/"} {
		r := redirect(to)
		_, err := c.Post(context.Background(), r.URL, []byte("{}"), nil)
		r.Close()
		if !errors.Is(err, webhook.ErrRefusedAddress) {
			t.Errorf("redirect to %s: %v, want refused", to, err)
		}
	}
	// A redirect to an allowed address is followed.
	r := redirect(target.URL)
	defer r.Close()
	if status, err := c.Post(context.Background(), r.URL, []byte("{}"), nil); err != nil || status != 202 {
		t.Fatalf("redirect to an allowed address: %d %v", status, err)
	}
}

func TestAllowed(t *testing.T) {
	c := webhook.New(webhook.Config{})
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "2606:4700::1111": true, "127.0.0.1": false, "::ffff:10.0.0.1": false, "64:ff9b::a00:1": false,
		"169.254.169.254": false, "fe80::1": false, "224.0.0.1": false, "255.255.255.255": false, "198.18.0.1": false,
	} {
		if got := c.Allowed(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Allowed(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestSign(t *testing.T) {
	// echo -n '{"resourceType":"Patient"}' | openssl dgst -sha256 -hmac secret
	if got := webhook.Sign("secret", []byte(`{"resourceType":"Patient"}`)); got != "cef723bee3f64f98f5120b298ccebc63b41e739271e1eed80e495f3095223b6b" {
		t.Fatalf("signature %q", got)
	}
}
