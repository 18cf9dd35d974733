//go:build !linux

package runtime

import "os"

func lowerPriority() {}

func maxRSS(*os.ProcessState) int64 { return 0 }

// limitSelf does nothing outside Linux: the compiler child still keeps a
// compiler crash out of the server, but its ceilings are the wall-clock
// timeout only.
func limitSelf(memory, cpu int64) error { return nil }

func killedBySignal(*os.ProcessState) bool { return false }
