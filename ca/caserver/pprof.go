package caserver

import (
	"net/http"
	"net/http/pprof"
)

// pprofHandlers returns Go's profiling endpoints (net/http/pprof) for the
// monitoring listener when on, else nil. They are off by default: profiles
// expose internals and a CPU profile costs CPU, so they are for performance
// work on a private listener (docs/benchmarks.md shows how they are used).
func pprofHandlers(on bool) map[string]http.Handler {
	if !on {
		return nil
	}
	return map[string]http.Handler{
		"/debug/pprof/":        http.HandlerFunc(pprof.Index),
		"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
		"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	}
}
