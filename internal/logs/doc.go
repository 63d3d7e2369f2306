// Package logs holds the one rule for a component's logger (a nil
// Config.Logger discards logs; the binaries in cmd/ pass their own) and
// the binaries' log output: a Buffer that writes lines within a bounded
// delay, many to a write system call, flushed at once on warnings and
// errors (FlushOn). keys.go holds every log key as a constant (one name
// for one thing: an error is "error"); a test fails on a key written as a
// string literal.
package logs
