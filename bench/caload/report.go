package caload

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshid/meshid/bench/latency"
)

// Report is the outcome of one run at one concurrency.
type Report struct {
	Concurrency int
	KeyType     string
	Pregen      bool
	Identities  int
	Elapsed     time.Duration
	// Requests counts completed requests, OK those that returned a chain.
	Requests int
	OK       int
	// Errors counts failed requests by gRPC code name ("Unauthenticated",
	// "ResourceExhausted", ...) or CodeBadResponse.
	Errors map[string]int
	// FirstErrors is the first message of each code in Errors (which
	// worker's first, when several saw it), so that a failing run says why.
	FirstErrors map[string]string
	// Throughput is successful issuances per second of Elapsed.
	Throughput float64
	// Latency summarises the successful requests.
	Latency latency.Summary
	// ServerCPU and ClientCPU are the CPU time the CA's process and the
	// load's own process used during the run, when Config.ServerCPU and
	// Config.ClientCPU were set (0 otherwise).
	ServerCPU time.Duration
	ClientCPU time.Duration
}

// CPUPerCert returns d per successful issuance, or 0.
func (r *Report) CPUPerCert(d time.Duration) time.Duration {
	if r.OK == 0 {
		return 0
	}
	return d / time.Duration(r.OK)
}

type reportJSON struct {
	Concurrency    int               `json:"concurrency"`
	KeyType        string            `json:"key_type"`
	Pregen         bool              `json:"pregen_keys"`
	Identities     int               `json:"identities"`
	ElapsedSeconds float64           `json:"elapsed_s"`
	Requests       int               `json:"requests"`
	OK             int               `json:"ok"`
	Errors         map[string]int    `json:"errors"`
	FirstErrors    map[string]string `json:"first_errors,omitempty"`
	Throughput     float64           `json:"certs_per_second"`
	Latency        latency.Summary   `json:"latency"`
	ServerCPU      float64           `json:"ca_cpu_s,omitempty"`
	ClientCPU      float64           `json:"client_cpu_s,omitempty"`
	ServerCPUCert  float64           `json:"ca_cpu_us_per_cert,omitempty"`
	ClientCPUCert  float64           `json:"client_cpu_us_per_cert,omitempty"`
}

// MarshalJSON renders the report with snake_case names, elapsed_s in seconds,
// certs_per_second, and latency in milliseconds; errors is always an object.
func (r *Report) MarshalJSON() ([]byte, error) {
	errs := r.Errors
	if errs == nil {
		errs = map[string]int{}
	}
	return json.Marshal(reportJSON{
		Concurrency: r.Concurrency, KeyType: r.KeyType, Pregen: r.Pregen, Identities: r.Identities,
		ElapsedSeconds: math.Round(r.Elapsed.Seconds()*1e6) / 1e6,
		Requests:       r.Requests, OK: r.OK, Errors: errs, FirstErrors: r.FirstErrors,
		Throughput:    math.Round(r.Throughput*10) / 10,
		Latency:       r.Latency,
		ServerCPU:     math.Round(r.ServerCPU.Seconds()*1e3) / 1e3,
		ClientCPU:     math.Round(r.ClientCPU.Seconds()*1e3) / 1e3,
		ServerCPUCert: math.Round(float64(r.CPUPerCert(r.ServerCPU).Nanoseconds())/100) / 10,
		ClientCPUCert: math.Round(float64(r.CPUPerCert(r.ClientCPU).Nanoseconds())/100) / 10,
	})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Report) UnmarshalJSON(b []byte) error {
	var j reportJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("caload: %w", err)
	}
	*r = Report{
		Concurrency: j.Concurrency, KeyType: j.KeyType, Pregen: j.Pregen, Identities: j.Identities,
		Elapsed:  time.Duration(math.Round(j.ElapsedSeconds * float64(time.Second))),
		Requests: j.Requests, OK: j.OK, Errors: j.Errors, FirstErrors: j.FirstErrors, Throughput: j.Throughput, Latency: j.Latency,
		ServerCPU: time.Duration(math.Round(j.ServerCPU * float64(time.Second))),
		ClientCPU: time.Duration(math.Round(j.ClientCPU * float64(time.Second))),
	}
	return nil
}

// FormatErrors renders errors by code as "Code=n Code=n" in code order, or
// "-" when there are none.
func FormatErrors(errs map[string]int) string {
	codes := make([]string, 0, len(errs))
	for c, n := range errs {
		if n > 0 {
			codes = append(codes, c)
		}
	}
	if len(codes) == 0 {
		return "-"
	}
	slices.Sort(codes)
	var b strings.Builder
	for i, c := range codes {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", c, errs[c])
	}
	return b.String()
}

// WriteTable writes one row per report: concurrency, requests, successes,
// certificates per second, latency percentiles and errors by code, and the
// CPU time per certificate of the CA and of the load when measured.
func WriteTable(w io.Writer, reports []*Report) error {
	cpu := slices.ContainsFunc(reports, func(r *Report) bool { return r.ServerCPU > 0 || r.ClientCPU > 0 })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "CONCURRENCY\tREQUESTS\tOK\tCERTS/S\tP50\tP90\tP99\tMAX\tERRORS"
	if cpu {
		head += "\tCA CPU/CERT\tLOAD CPU/CERT"
	}
	fmt.Fprintln(tw, head)
	for _, r := range reports {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t%s",
			r.Concurrency, r.Requests, r.OK, r.Throughput,
			latency.Format(r.Latency.P50), latency.Format(r.Latency.P90),
			latency.Format(r.Latency.P99), latency.Format(r.Latency.Max), FormatErrors(r.Errors))
		if cpu {
			fmt.Fprintf(tw, "\t%s\t%s", formatCPU(r.CPUPerCert(r.ServerCPU)), formatCPU(r.CPUPerCert(r.ClientCPU)))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeFirstErrors(w, reports)
}

// writeFirstErrors writes, under the table, the first message of each
// error code across the reports: counts alone do not say what went wrong.
func writeFirstErrors(w io.Writer, reports []*Report) error {
	first := map[string]string{}
	for _, r := range reports {
		for c, m := range r.FirstErrors {
			if _, seen := first[c]; !seen && r.Errors[c] > 0 {
				first[c] = m
			}
		}
	}
	codes := slices.Sorted(maps.Keys(first))
	for i, c := range codes {
		if i == 0 {
			if _, err := fmt.Fprintln(w, "\nfirst error of each code:"); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintf(w, "  %s: %s\n", c, first[c]); err != nil {
			return err
		}
	}
	return nil
}

func formatCPU(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return latency.Format(d)
}
