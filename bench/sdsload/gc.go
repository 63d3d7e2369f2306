package sdsload

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// holdGC collects once, then turns this process's garbage collector off
// until the returned function is called, keeping a soft memory limit of
// limit bytes (unless a lower one is set, e.g. by GOMEMLIMIT) so that the
// heap still cannot grow without bound.
//
// Why: the load is a Go program on the same few CPUs as the agent, and its
// heap grows with every stream it opens. With GOGC=100 it ran 4-5 mark
// phases of 6-23 ms during a 2,000-stream --open-concurrency 1 run on a
// 2-CPU machine, and the streams opening during them took 1-10 ms: the
// load's own collector, not the agent, set the p99 (execution traces of
// both processes in docs/benchmarks.md, "SDS (target 3)"). Envoy, whose
// latency the figure stands for, has no garbage collector.
func holdGC(limit int64) (restore func()) {
	runtime.GC()
	percent := debug.SetGCPercent(-1)
	old := debug.SetMemoryLimit(-1) // -1 reads the limit without changing it
	if old == math.MaxInt64 || old > limit {
		debug.SetMemoryLimit(limit)
	}
	return func() {
		debug.SetMemoryLimit(old)
		debug.SetGCPercent(percent)
	}
}

// gcCycles returns the number of garbage collections this process has
// completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
