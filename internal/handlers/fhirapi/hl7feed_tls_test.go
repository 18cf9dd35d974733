package fhirapi_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandbot/sandbot/internal/mllp"
	"github.com/sandbot/sandbot/internal/server"
	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/services/hl7feed"
)

// TestHL7FeedOverTLS: a listener configured with cert=, key= and clientca=
// (SANDBOT_MLLP_ADDRS) speaks MLLP over TLS: a client with a certificate
// signed by the CA is answered AA and its message reaches the bot; a
// client without a certificate, and a plain TCP client, are closed without
// an answer, and the connection limit still holds them to account.
func TestHL7FeedOverTLS(t *testing.T) {
	t.Parallel()
	ca := servertest.NewCert(t, "ca", nil, true)
	srvCert := servertest.NewCert(t, "server", ca, false)
	clientCert := servertest.NewCert(t, "client", ca, false)
	project := uuid.NewString()
	listeners, err := hl7feed.ParseListeners("127.0.0.1:0=" + project + ";cert=" + srvCert.CertFile + ";key=" + srvCert.KeyFile +
		";clientca=" + ca.CertFile)
	if err != nil || len(listeners) != 1 || listeners[0].TLS == nil {
		t.Fatalf("%v %v", listeners, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.X509)
	pair, err := tls.LoadX509KeyPair(clientCert.CertFile, clientCert.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	servertest.ForEachBackend(t, func(t *testing.T, s *servertest.Server) {
		f := newFeedFor(t, s, project, "")
		dial := func(cfg *tls.Config) *conn {
			c, err := tls.Dial("tcp", f.addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return &conn{t: t, Conn: c, r: mllp.NewReader(c, 1<<20)}
		}
		c := dial(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}})
		if code, ctl, _ := c.send(mllp.Frame(adt("TLS1", "P1"))); code != "AA" || ctl != "TLS1" {
			t.Fatalf("over TLS: %s %s", code, ctl)
		}
		if got := recorded(t, f.c, 1); len(got) != 1 || got[0] != "TLS1 x-application/hl7-v2+er7 P1 adt" {
			t.Fatalf("the bot recorded %q", got)
		}
		// No client certificate: the handshake fails (TLS 1.3 tells the
		// client at its first read), and nothing is answered.
		anon := dial(&tls.Config{RootCAs: roots})
		anon.Write(mllp.Frame(adt("ANON1", "P1")))
		anon.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := anon.r.ReadFrame(); err == nil {
			t.Fatalf("a client without a certificate was answered %q", b)
		}
		// Plain TCP on the TLS port: closed without an answer.
		plain := dialMLLP(t, f.addr)
		plain.Write(mllp.Frame(adt("PLAIN1", "P1")))
		if !closedWithin(plain, 10*time.Second) {
			t.Error("a plain TCP client was kept on the TLS listener")
		}
		if v := servertest.MetricValue(t, s.Registry, "sandbot_mllp_framing_errors_total"); v < 2 {
			t.Errorf("framing errors (tls) %v, want 2 failed handshakes", v)
		}
	}, func(cfg *server.Config) { cfg.MLLP = listeners })
}
