// Command floor is the machine's floor for bench/bots: a bare net/http
// server that reads a POST body and answers {"ok":true}, what a bot
// platform cannot beat. bench/bots/run.sh drives it with wrk in the same
// run as sandbot, so that sandbot's figures are read as ratios to it.
package main

import (
	"io"
	"log"
	"net/http"
	"os"
)

func main() {
	addr := "127.0.0.1:18130"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	body := []byte(`{"ok":true}`)
	log.Fatal(http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})))
}
