//go:build !unix

package cputime

import "time"

// Rusage is not measured on this platform: it returns 0.
func Rusage() time.Duration { return 0 }
