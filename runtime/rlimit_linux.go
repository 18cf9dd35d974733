package runtime

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// limitSelf caps the compiler child: memory more bytes of address space than
// it has mapped now (the Go runtime reserves address space at start), and
// cpu seconds of CPU time, after which the kernel kills it (the soft limit's
// SIGXCPU is ignored by Go, so soft = hard).
func limitSelf(memory, cpu int64) error {
	base, err := mappedBytes()
	if err != nil {
		return err
	}
	as := uint64(base + memory)
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: as, Max: as}); err != nil {
		return err
	}
	return syscall.Setrlimit(syscall.RLIMIT_CPU, &syscall.Rlimit{Cur: uint64(cpu), Max: uint64(cpu)})
}

// lowerPriority makes this process nice 10.
func lowerPriority() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, 10) }

// maxRSS is a finished process's peak resident set.
func maxRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10
	}
	return 0
}

// killedBySignal reports whether a finished process was killed by SIGKILL
// or SIGXCPU.
func killedBySignal(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && (ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGXCPU)
}

// mappedBytes is this process's virtual memory size (VmSize).
func mappedBytes() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, os.ErrNotExist
}
