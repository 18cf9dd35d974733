package hl7feed

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
)

// Listener is one address the server listens on for MLLP, the project its
// messages go to, the source addresses it accepts (none: any), and its TLS
// configuration (nil: plain TCP).
type Listener struct {
	Addr    string
	Project string
	Allow   []*net.IPNet
	TLS     *tls.Config
}

// ParseListeners reads SANDBOT_MLLP_ADDRS: listeners separated by commas,
// each ADDR=PROJECT, optionally followed by ;CIDR for each source network
// it accepts (":2575=0b6f…;10.0.0.0/8;192.168.1.0/24"), and by
// ;cert=FILE;key=FILE for MLLP over TLS (PEM files, read now), with
// ;clientca=FILE to require client certificates signed by those CAs. The
// operator who sets it decides which project a port feeds; no API call
// opens a port.
func ParseListeners(s string) ([]Listener, error) {
	var out []Listener
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ";")
		addr, project, ok := strings.Cut(parts[0], "=")
		addr, project = strings.TrimSpace(addr), strings.TrimSpace(project)
		if !ok || addr == "" || project == "" {
			return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %q is not ADDR=PROJECT[;CIDR...]", item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %q: %v", addr, err)
		}
		if seen[addr] {
			return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %s given twice", addr)
		}
		seen[addr] = true
		l := Listener{Addr: addr, Project: project}
		files := map[string]string{}
		for _, c := range parts[1:] {
			c = strings.TrimSpace(c)
			if k, v, ok := strings.Cut(c, "="); ok {
				switch k {
				case "cert", "key", "clientca":
					files[k] = v
					continue
				}
				return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %q: an option is cert=, key= or clientca=", c)
			}
			_, n, err := net.ParseCIDR(c)
			if err != nil {
				return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %q: %v", c, err)
			}
			l.Allow = append(l.Allow, n)
		}
		if len(files) > 0 {
			cfg, err := tlsConfig(files)
			if err != nil {
				return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %s: %v", addr, err)
			}
			l.TLS = cfg
		}
		out = append(out, l)
	}
	return out, nil
}

// allowed reports whether the listener accepts a connection from ip.
func (l Listener) allowed(ip net.IP) bool {
	if len(l.Allow) == 0 {
		return true
	}
	for _, n := range l.Allow {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// tlsConfig is a listener's TLS: its certificate and key, and the CAs of
// the client certificates it requires, if any.
func tlsConfig(files map[string]string) (*tls.Config, error) {
	if files["cert"] == "" || files["key"] == "" {
		return nil, fmt.Errorf("MLLP over TLS needs both cert= and key=")
	}
	pair, err := tls.LoadX509KeyPair(files["cert"], files["key"])
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if ca := files["clientca"]; ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
