package sdk

import "fmt"

// Level is a log line's level.
type Level int32

// Log levels, as the ABI numbers them.
const (
	LevelDebug Level = 0
	LevelInfo  Level = 1
	LevelWarn  Level = 2
	LevelError Level = 3
)

// Log writes an info line to the execution's log (the server keeps the last
// 10 KiB of it in the execution's AuditEvent).
func Log(msg string) { LogAt(LevelInfo, msg) }

// Logf writes a formatted info line to the execution's log.
func Logf(format string, args ...any) { LogAt(LevelInfo, fmt.Sprintf(format, args...)) }

// LogAt writes a line at the given level.
func LogAt(level Level, msg string) { hostLog(level, msg) }
