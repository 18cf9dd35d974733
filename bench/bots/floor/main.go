// Command floor is the machine's floor for bench/bots: a bare net/http
// server that reads a POST body and answers {"ok":true}, what a bot
// platform cannot beat. bench/bots/run.sh drives it with wrk in the same
// run as sandbot, so that sandbot's figures are read as ratios to it.
//
// Given a directory as well (floor ADDR DIR), it is the durable floor: each
// request also appends a 300-byte line (an AuditEvent's size in sandbot's
// journal) to a file in DIR and answers once the line is on disk, the lines
// of concurrent requests written and synced together, one fdatasync at a
// time, to a file filled with zeros beforehand: what sandbot's audit journal
// does, and what no server that answers only after a durable write can
// beat on this disk.
package main

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
)

func main() {
	addr := "127.0.0.1:18130"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	var durable func() error
	if len(os.Args) > 2 {
		durable = openLog(os.Args[2])
	}
	body := []byte(`{"ok":true}`)
	log.Fatal(http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if durable != nil {
			if err := durable(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})))
}

// logBytes is the log file's size; appends wrap around to its start.
const logBytes = 64 << 20

// openLog creates the log file in dir, filled with zeros and synced, and
// answers the function that appends a line to it and returns once the line
// is on disk.
func openLog(dir string) func() error {
	f, err := os.OpenFile(filepath.Join(dir, "floor.log"), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < logBytes; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros, off); err != nil {
			log.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		log.Fatal(err)
	}
	line := append(bytes.Repeat([]byte("x"), 299), '\n')
	in := make(chan chan error, 4096)
	go func() {
		var off int64
		var buf []byte
		var batch []chan error
		for c := range in {
			batch = append(batch[:0], c)
		fill:
			for {
				select {
				case more := <-in:
					batch = append(batch, more)
				default:
					break fill
				}
			}
			buf = buf[:0]
			for range batch {
				buf = append(buf, line...)
			}
			if off+int64(len(buf)) > logBytes {
				off = 0
			}
			_, err := f.WriteAt(buf, off)
			if err == nil {
				err = syscall.Fdatasync(int(f.Fd()))
			}
			off += int64(len(buf))
			for _, c := range batch {
				c <- err
			}
		}
	}()
	return func() error {
		c := make(chan error, 1)
		in <- c
		return <-c
	}
}
