package bots

import (
	goruntime "runtime"
	"syscall"
)

// startLowPriority starts a goroutine on an OS thread of its own at the
// lowest scheduling priority, nice 19 (on Linux a thread's nice value is
// its own, not the process's): work handed to it gets a core only as far
// as the threads that serve requests leave one, and the kernel lets a
// woken request thread preempt it at once. It answers nil when the
// thread's priority cannot be lowered.
func startLowPriority() *lowPriority {
	l := &lowPriority{work: make(chan func()), finished: make(chan struct{})}
	started := make(chan bool)
	go func() {
		// Never unlocked: the thread ends with the goroutine instead of
		// going back to the runtime's pool at nice 19, where it would run
		// any goroutine.
		goruntime.LockOSThread()
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19); err != nil {
			started <- false
			return
		}
		started <- true
		for fn := range l.work {
			fn()
			l.finished <- struct{}{}
		}
	}()
	if !<-started {
		return nil
	}
	return l
}
