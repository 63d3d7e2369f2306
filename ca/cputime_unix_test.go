//go:build unix

package ca_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) the test process has used.
// Benchmarks report CPU time per certificate as well as wall-clock
// throughput, because the former is not distorted by other load on the
// machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
