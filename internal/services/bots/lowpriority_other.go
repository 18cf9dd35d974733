//go:build !linux

package bots

// startLowPriority answers nil: elsewhere than on Linux a nice value is the
// whole process's, and the audit writer runs at the server's priority.
func startLowPriority() *lowPriority { return nil }
