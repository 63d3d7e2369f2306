package sdsserver

import "github.com/meshid/meshid/internal/logs"

// CachedNames returns how many names the server's resource cache holds.
func CachedNames(s *Server) int { return s.hub.size() }

// WarnBurst is the number of warnings a stream may log at once.
const WarnBurst = logs.WarnBurst

// Uniq is uniq, for its benchmark.
var Uniq = uniq
