package caserver

import "runtime/debug"

// applyGC sets the process's garbage collector target and soft memory
// limit (Config.Runtime.GCPercent and MemoryLimit, defaults applied): a negative
// percent or a zero limit leaves the runtime's own (GOGC, GOMEMLIMIT).
// They are process-wide settings, so only Run applies them.
func applyGC(percent int, limit int64) {
	if percent >= 0 {
		debug.SetGCPercent(percent)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
}
