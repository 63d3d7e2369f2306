package latency_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meshid/meshid/bench/latency"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = ms(i + 1) // 1ms..100ms
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p50", []time.Duration{ms(7)}, 50, ms(7)},
		{"single p99", []time.Duration{ms(7)}, 99, ms(7)},
		{"two p50 is the lower", []time.Duration{ms(1), ms(2)}, 50, ms(1)},
		{"two p51 is the upper", []time.Duration{ms(1), ms(2)}, 51, ms(2)},
		{"hundred p50", hundred, 50, ms(50)},
		{"hundred p90", hundred, 90, ms(90)},
		{"hundred p99", hundred, 99, ms(99)},
		{"hundred p99.5", hundred, 99.5, ms(100)},
		{"hundred p100", hundred, 100, ms(100)},
		{"p0 is min", hundred, 0, ms(1)},
		{"above 100 is max", hundred, 150, ms(100)},
		{"ten p99 is max", hundred[:10], 99, ms(10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := latency.Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(p%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestRecorderMergeAndSummary(t *testing.T) {
	a, b, c := latency.NewRecorder(4), &latency.Recorder{}, latency.NewRecorder(0)
	for _, d := range []int{9, 1, 5} {
		a.Record(ms(d))
	}
	for _, d := range []int{3, 7} {
		b.Record(ms(d))
	}
	c.Merge(a, b)
	if c.Len() != 5 {
		t.Fatalf("Len = %d, want 5", c.Len())
	}
	got := c.Summary()
	want := latency.Summary{Count: 5, Min: ms(1), Mean: ms(5), P50: ms(5), P90: ms(9), P99: ms(9), Max: ms(9)}
	if got != want {
		t.Errorf("Summary = %+v, want %+v", got, want)
	}
	if a.Len() != 3 || b.Len() != 2 {
		t.Errorf("Merge changed its arguments: %d %d", a.Len(), b.Len())
	}
	if (latency.Summarize(nil) != latency.Summary{}) {
		t.Errorf("empty summary is not zero")
	}
}

func TestSummaryJSONRoundTrip(t *testing.T) {
	s := latency.Summary{Count: 3, Min: 250 * time.Microsecond, Mean: 1500 * time.Microsecond,
		P50: ms(1), P90: ms(2), P99: ms(3), Max: 4*time.Millisecond + 500*time.Microsecond}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"count":3,"min_ms":0.25,"mean_ms":1.5,"p50_ms":1,"p90_ms":2,"p99_ms":3,"max_ms":4.5}`
	if string(b) != want {
		t.Errorf("JSON = %s, want %s", b, want)
	}
	var back latency.Summary
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != s {
		t.Errorf("round trip = %+v, want %+v", back, s)
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{500, "500ns"},
		{850 * time.Microsecond, "850µs"},
		{1234 * time.Microsecond, "1.23ms"},
		{12345 * time.Microsecond, "12.3ms"},
		{123456 * time.Microsecond, "123ms"},
		{1500 * time.Millisecond, "1.50s"},
		{90 * time.Second, "90.0s"},
	}
	for _, tt := range tests {
		if got := latency.Format(tt.d); got != tt.want {
			t.Errorf("Format(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
