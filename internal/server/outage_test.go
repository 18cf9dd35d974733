package server_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/store/storetest"
)

// cuttableProxy forwards TCP connections to a database and can cut them
// all and refuse new ones, as a database that goes away does.
type cuttableProxy struct {
	addr, target string
	mu           sync.Mutex
	lis          net.Listener
	conns        []net.Conn
}

func newCuttableProxy(t *testing.T, target string) *cuttableProxy {
	p := &cuttableProxy{target: target}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(p.cut)
	return p
}

func (p *cuttableProxy) serve(lis net.Listener) {
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
}

// cut closes the listener (new connections are refused) and resets every
// open connection.
func (p *cuttableProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		p.lis.Close()
		p.lis = nil
	}
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	p.conns = nil
}

func (p *cuttableProxy) restore(t *testing.T) {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(lis)
}

// TestDatabaseOutageIs503: while the database cannot be reached, the API
// answers 503 OperationOutcomes with Retry-After (never 500) and /readyz
// fails; once it is back, the same server serves again without a restart.
func TestDatabaseOutageIs503(t *testing.T) {
	for _, b := range storetest.Backends(t) {
		if b.Name != "postgres" {
			continue
		}
		dbURL, err := url.Parse(b.NewURL(t))
		if err != nil {
			t.Fatal(err)
		}
		proxy := newCuttableProxy(t, dbURL.Host)
		dbURL.Host = proxy.addr
		s := servertest.StartURL(t, b.Name, dbURL.String())
		c := s.NewProject(t, "outage")
		create := func() *servertest.Response {
			return c.Do("POST", "fhir/R4/Patient", map[string]any{"resourceType": "Patient"}, "")
		}
		if r := create(); r.Status != 201 {
			t.Fatalf("before: %d", r.Status)
		}
		proxy.cut()
		for i := 0; i < 20; i++ {
			r := create()
			if r.Status != 503 || r.Header.Get("Retry-After") == "" || r.JSON()["resourceType"] != "OperationOutcome" {
				t.Fatalf("write %d during the outage: %d %v %s", i, r.Status, r.Header, r.Body)
			}
		}
		if r := c.Do("GET", "fhir/R4/Patient?_count=1", nil, ""); r.Status != 503 {
			t.Errorf("search during the outage: %d", r.Status)
		}
		if st, _, _ := get(t, s.Ops.URL+"/readyz"); st != 503 {
			t.Errorf("/readyz during the outage: %d", st)
		}
		proxy.restore(t)
		eventually(t, "writes after the database came back", 10*time.Second, func() bool {
			r := create()
			if r.Status != 201 && r.Status != 503 {
				t.Fatalf("write after the outage: %d %s", r.Status, r.Body)
			}
			return r.Status == 201
		})
		if st, _, _ := get(t, s.Ops.URL+"/readyz"); st != 200 {
			t.Errorf("/readyz after the outage: %d", st)
		}
	}
}
