package bots

// lowPriority runs work on an OS thread of the lowest priority
// (startLowPriority); the audit writer stores there while it keeps up with
// executions, so that its CPU is taken only from what they leave
// (docs/performance.md, "Where the slow requests wait").
type lowPriority struct {
	work     chan func()
	finished chan struct{}
}

// run runs fn on the low-priority thread and returns when it is done; on a
// nil *lowPriority, on the caller's goroutine.
func (l *lowPriority) run(fn func()) {
	if l == nil {
		fn()
		return
	}
	l.work <- fn
	<-l.finished
}

// stop ends the thread; nil is harmless.
func (l *lowPriority) stop() {
	if l != nil {
		close(l.work)
	}
}
