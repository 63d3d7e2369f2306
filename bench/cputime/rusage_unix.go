//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Rusage returns the CPU time (user + system) this process has used, from
// getrusage: microsecond resolution, unlike Self's clock ticks, so that a
// Go benchmark can report CPU time per operation, which other load on the
// machine does not distort as it does wall-clock throughput. It returns 0
// when the time cannot be read.
func Rusage() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
