package hl7feed

import (
	"fmt"
	"net"
	"strings"
)

// Listener is one address the server listens on for MLLP, the project its
// messages go to, and the source addresses it accepts (none: any).
type Listener struct {
	Addr    string
	Project string
	Allow   []*net.IPNet
}

// ParseListeners reads SANDBOT_MLLP_ADDRS: listeners separated by commas,
// each ADDR=PROJECT, optionally followed by ;CIDR for each source network
// it accepts (":2575=0b6f…;10.0.0.0/8;192.168.1.0/24"). The operator who sets
// it decides which project a port feeds; no API call opens a port.
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
		for _, c := range parts[1:] {
			_, n, err := net.ParseCIDR(strings.TrimSpace(c))
			if err != nil {
				return nil, fmt.Errorf("SANDBOT_MLLP_ADDRS: %q: %v", c, err)
			}
			l.Allow = append(l.Allow, n)
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
