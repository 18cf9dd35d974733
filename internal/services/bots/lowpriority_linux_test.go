package bots

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// threadNice reads the calling thread's nice value from /proc.
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", syscall.Gettid()))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis: state is the
	// 3rd field of the line, nice the 19th.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.Atoi(fields[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLowPriorityRunsAtNice19: work handed to the low-priority thread runs
// at nice 19, the caller's thread keeps its priority, and the runtime's
// other threads are not lowered (the thread is never handed back).
func TestLowPriorityRunsAtNice19(t *testing.T) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	before := threadNice(t)
	l := startLowPriority()
	if l == nil {
		t.Fatal("the priority of a thread could not be lowered")
	}
	var inside int
	var tid int
	l.run(func() { inside, tid = threadNice(t), syscall.Gettid() })
	if inside != 19 {
		t.Fatalf("work ran at nice %d, want 19", inside)
	}
	if tid == syscall.Gettid() || threadNice(t) != before {
		t.Fatalf("the caller's thread (nice %d, was %d) ran the work or was lowered", threadNice(t), before)
	}
	l.stop()
	var nilLow *lowPriority
	ran := false
	nilLow.run(func() { ran = true })
	nilLow.stop()
	if !ran {
		t.Fatal("a nil lowPriority did not run the work on the caller")
	}
}
