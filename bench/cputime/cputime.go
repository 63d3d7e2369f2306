package cputime

import (
	"fmt"
	"os"
	"time"

	"github.com/prometheus/procfs"
)

// Process returns the CPU time process pid has used so far, from
// /proc/<pid>/stat (clock-tick resolution, 10ms on Linux).
func Process(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("cputime: process %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("cputime: process %d: %w", pid, err)
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}

// Self returns the CPU time this process has used so far.
func Self() (time.Duration, error) { return Process(os.Getpid()) }

// Of returns a function that reads the CPU time of process pid, the form
// the load generators take.
func Of(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) { return Process(pid) }
}
