// Package outage classifies errors that say the database could not be
// reached or went away: the same request may succeed in a moment, so callers
// answer 503 with Retry-After, or try a job again later, rather than treat it
// as a bug. It is a leaf, so that the HTTP layer can map errors without
// importing the store.
package outage

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"strings"
	"syscall"
)

// Is reports whether err says that the database could not be reached or went
// away (refused or reset connection, a server shutting down, starting up or
// out of connections), or aborted this transaction to break a deadlock.
func Is(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		code := state.SQLState()
		// 08: connection exception; 57P01-03: admin shutdown, crash
		// shutdown, cannot connect now; 53300: too many connections;
		// 40P01, 40001: a deadlock or serialization failure broken by
		// aborting this transaction (two transaction Bundles taking
		// conditional locks in opposite orders): nothing was written, and
		// the same request may well succeed when sent again.
		return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03" || code == "53300" ||
			code == "40P01" || code == "40001"
	}
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns)
}
