package latency

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// Recorder collects latency samples. The zero value is ready to use.
type Recorder struct {
	samples []time.Duration
}

// NewRecorder returns a Recorder with room for n samples, so that recording
// does not allocate on the measured path until n is exceeded.
func NewRecorder(n int) *Recorder {
	return &Recorder{samples: make([]time.Duration, 0, max(n, 0))}
}

// Record adds one sample.
func (r *Recorder) Record(d time.Duration) { r.samples = append(r.samples, d) }

// Len returns the number of samples recorded.
func (r *Recorder) Len() int { return len(r.samples) }

// Merge appends every sample of others to r.
func (r *Recorder) Merge(others ...*Recorder) {
	n := len(r.samples)
	for _, o := range others {
		n += len(o.samples)
	}
	r.samples = slices.Grow(r.samples, n-len(r.samples))
	for _, o := range others {
		r.samples = append(r.samples, o.samples...)
	}
}

// Summary sorts the samples and summarises them.
func (r *Recorder) Summary() Summary { return Summarize(r.samples) }

// Summary describes a set of latency samples. Every field is zero when there
// were no samples.
type Summary struct {
	Count int
	Min   time.Duration
	Mean  time.Duration
	P50   time.Duration
	P90   time.Duration
	P99   time.Duration
	Max   time.Duration
}

// Summarize sorts samples in place and returns their summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum float64
	for _, d := range samples {
		sum += float64(d)
	}
	return Summary{
		Count: len(samples),
		Min:   samples[0],
		Mean:  time.Duration(sum / float64(len(samples))),
		P50:   Percentile(samples, 50),
		P90:   Percentile(samples, 90),
		P99:   Percentile(samples, 99),
		Max:   samples[len(samples)-1],
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted samples: the smallest sample such that at least p% of the samples
// are less than or equal to it. It returns 0 for no samples; p <= 0 gives the
// minimum and p >= 100 the maximum.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// summaryJSON is the wire shape of a Summary: milliseconds as numbers, so that
// scripts and spreadsheets read them without parsing Go durations.
type summaryJSON struct {
	Count  int     `json:"count"`
	MinMS  float64 `json:"min_ms"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// Millis converts d to fractional milliseconds, rounded to the microsecond.
func Millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// MarshalJSON renders the summary with millisecond numbers (count, min_ms,
// mean_ms, p50_ms, p90_ms, p99_ms, max_ms).
func (s Summary) MarshalJSON() ([]byte, error) {
	return json.Marshal(summaryJSON{
		Count: s.Count, MinMS: Millis(s.Min), MeanMS: Millis(s.Mean),
		P50MS: Millis(s.P50), P90MS: Millis(s.P90), P99MS: Millis(s.P99), MaxMS: Millis(s.Max),
	})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Summary) UnmarshalJSON(b []byte) error {
	var j summaryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	ms := func(f float64) time.Duration { return time.Duration(math.Round(f * float64(time.Millisecond))) }
	*s = Summary{Count: j.Count, Min: ms(j.MinMS), Mean: ms(j.MeanMS), P50: ms(j.P50MS),
		P90: ms(j.P90MS), P99: ms(j.P99MS), Max: ms(j.MaxMS)}
	return nil
}

// Format renders d for a table with three significant digits in the largest
// fitting unit: "850µs", "1.23ms", "12.3ms", "1.50s". Zero is "0".
func Format(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return sig3(float64(d)/float64(time.Microsecond), "µs")
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond), "ms")
	}
	return sig3(d.Seconds(), "s")
}

func sig3(v float64, unit string) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	}
	return fmt.Sprintf("%.2f%s", v, unit)
}
