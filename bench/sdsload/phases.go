package sdsload

import (
	"cmp"
	"slices"
	"time"
)

// phases are the instants of one stream's opening, and the collections of
// this process meanwhile.
type phases struct {
	start  time.Time // the stream's turn came
	opened time.Time // StreamSecrets returned
	sent   time.Time // the first request was sent
	first  time.Time // the first response arrived
	ready  time.Time // every resource had arrived
	gc     uint64    // collections of this process that ended from start to ready
}

// StreamTiming is where one stream's time to ready went.
type StreamTiming struct {
	Stream int
	// At is when the stream's turn came, from the first stream's.
	At time.Duration
	// Open is the StreamSecrets call, Request the sending of the first
	// request, FirstResponse from then to the first response, and Rest
	// from the first response until every resource had arrived.
	Open, Request, FirstResponse, Rest time.Duration
	Total                              time.Duration
	// GCCycles counts the collections of this process that ended
	// meanwhile (0 while HoldGC holds them off).
	GCCycles uint64
}

// slowest returns the n ready streams that took longest, slowest first.
func (t *tracker) slowest(n int, start time.Time) []StreamTiming {
	if n <= 0 {
		return nil
	}
	var out []StreamTiming
	for i, ph := range t.phases {
		if !t.isReadyS[i] {
			continue
		}
		out = append(out, StreamTiming{
			Stream: i, At: ph.start.Sub(start),
			Open: ph.opened.Sub(ph.start), Request: ph.sent.Sub(ph.opened),
			FirstResponse: ph.first.Sub(ph.sent), Rest: ph.ready.Sub(ph.first),
			Total: ph.ready.Sub(ph.start), GCCycles: ph.gc,
		})
	}
	slices.SortStableFunc(out, func(a, b StreamTiming) int { return cmp.Compare(b.Total, a.Total) })
	return out[:min(n, len(out))]
}
