// Package logs holds the one rule for a component's logger (a nil
// Config.Logger discards logs; the binaries in cmd/ pass their own) and
// the binaries' log output: a Buffer that writes lines within a bounded
// delay, many to a write system call, flushed at once on warnings and
// errors (FlushOn).
package logs
