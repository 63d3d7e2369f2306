// Package logs holds the one rule for a component's logger: a nil
// Config.Logger discards logs (the binaries in cmd/ pass their own).
package logs
