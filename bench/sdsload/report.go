package sdsload

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/meshid/meshid/bench/latency"
)

type reportJSON struct {
	Streams     int             `json:"streams"`
	Connections int             `json:"connections"`
	Resources   []string        `json:"resources"`
	Ready       int             `json:"ready"`
	Failed      int             `json:"failed"`
	TimeToReady latency.Summary `json:"time_to_ready"`
	AllReadyMS  float64         `json:"all_ready_ms"`
	GCCycles    uint64          `json:"gc_cycles"`
	Slowest     []slowJSON      `json:"slowest,omitempty"`
	Memory      *memoryJSON     `json:"memory,omitempty"`
	Rotation    *rotationJSON   `json:"rotation,omitempty"`
}

type slowJSON struct {
	Stream          int     `json:"stream"`
	AtMS            float64 `json:"at_ms"`
	OpenMS          float64 `json:"open_ms"`
	RequestMS       float64 `json:"request_ms"`
	FirstResponseMS float64 `json:"first_response_ms"`
	RestMS          float64 `json:"rest_ms"`
	TotalMS         float64 `json:"total_ms"`
	GCCycles        uint64  `json:"gc_cycles"`
}

type memoryJSON struct {
	PID                int     `json:"pid"`
	BeforeBytes        uint64  `json:"before_bytes"`
	AfterBytes         uint64  `json:"after_bytes"`
	AfterRotationBytes uint64  `json:"after_rotation_bytes,omitempty"`
	PerStreamBytes     float64 `json:"per_stream_bytes"`
}

type rotationJSON struct {
	Streams int             `json:"streams"`
	Rotated int             `json:"rotated"`
	Latency latency.Summary `json:"latency"`
	AllMS   float64         `json:"all_ms"`
}

// PerStream returns the growth of the agent's RSS per open stream, in bytes.
func (m *Memory) PerStream(streams int) float64 {
	if streams <= 0 {
		return 0
	}
	return (float64(m.After) - float64(m.Before)) / float64(streams)
}

// MarshalJSON renders the report with snake_case names, durations in
// milliseconds and memory in bytes.
func (r *Report) MarshalJSON() ([]byte, error) {
	j := reportJSON{
		Streams: r.Streams, Connections: r.Connections, Resources: r.Resources,
		Ready: r.Ready, Failed: r.Failed, TimeToReady: r.TimeToReady, AllReadyMS: latency.Millis(r.AllReady),
		GCCycles: r.GCCycles,
	}
	for _, st := range r.Slowest {
		j.Slowest = append(j.Slowest, slowJSON{Stream: st.Stream, AtMS: latency.Millis(st.At), OpenMS: latency.Millis(st.Open),
			RequestMS: latency.Millis(st.Request), FirstResponseMS: latency.Millis(st.FirstResponse),
			RestMS: latency.Millis(st.Rest), TotalMS: latency.Millis(st.Total), GCCycles: st.GCCycles})
	}
	if m := r.Memory; m != nil {
		j.Memory = &memoryJSON{PID: m.PID, BeforeBytes: m.Before, AfterBytes: m.After,
			AfterRotationBytes: m.AfterRotation, PerStreamBytes: float64(int64(m.PerStream(r.Ready)))}
	}
	if rot := r.Rotation; rot != nil {
		j.Rotation = &rotationJSON{Streams: rot.Streams, Rotated: rot.Rotated, Latency: rot.Latency, AllMS: latency.Millis(rot.All)}
	}
	return json.Marshal(j)
}

// WriteTable writes the report as a two-column table.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "STREAMS\t%d over %d connections, each subscribing %s\n", r.Streams, r.Connections, strings.Join(r.Resources, ", "))
	fmt.Fprintf(tw, "READY\t%d/%d (%d failed)\n", r.Ready, r.Streams, r.Failed)
	fmt.Fprintf(tw, "TIME TO READY\t%s (all ready after %s)\n", percentiles(r.TimeToReady), latency.Format(r.AllReady))
	fmt.Fprintf(tw, "LOAD GC\t%d collections of this process while the streams opened\n", r.GCCycles)
	for _, st := range r.Slowest {
		fmt.Fprintf(tw, "SLOW STREAM\t#%d at %s: %s = open %s + request %s + first response %s + rest %s; load GC %d\n",
			st.Stream, latency.Format(st.At), latency.Format(st.Total), latency.Format(st.Open), latency.Format(st.Request),
			latency.Format(st.FirstResponse), latency.Format(st.Rest), st.GCCycles)
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(tw, "AGENT RSS\tbefore %s, with streams open %s (%+.1f KiB/stream)", mib(m.Before), mib(m.After), m.PerStream(r.Ready)/1024)
		if m.AfterRotation > 0 {
			fmt.Fprintf(tw, ", after rotation %s", mib(m.AfterRotation))
		}
		fmt.Fprintln(tw)
	} else {
		fmt.Fprintf(tw, "AGENT RSS\tnot measured (no agent PID)\n")
	}
	if rot := r.Rotation; rot != nil {
		fmt.Fprintf(tw, "ROTATION\t%d/%d streams got the new certificate, the last after %s\n", rot.Rotated, rot.Streams, latency.Format(rot.All))
		fmt.Fprintf(tw, "ROTATION LATENCY\t%s\n", percentiles(rot.Latency))
	}
	return tw.Flush()
}

func percentiles(s latency.Summary) string {
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s", latency.Format(s.P50), latency.Format(s.P90),
		latency.Format(s.P99), latency.Format(s.Max))
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
