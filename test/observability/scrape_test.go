package observability_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/util/teststorage"
)

// target is a scraped process and the labels Prometheus's Kubernetes
// service discovery would give its series.
type target struct {
	addr      string // host:port of the monitoring listener
	namespace string
	pod       string
}

// sample is one series value of a scrape.
type sample struct {
	lbls labels.Labels
	v    float64
}

// scrape is what one GET /metrics of every target returned, as samples.
type scrape []sample

// record GETs /metrics of each target over HTTP, as Prometheus does, and
// parses the text exposition into samples labelled with the target.
func record(t *testing.T, targets ...target) scrape {
	t.Helper()
	var out scrape
	for _, tg := range targets {
		resp, err := http.Get("http://" + tg.addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s/metrics: %d %v", tg.addr, resp.StatusCode, err)
		}
		out = append(out, parseExposition(t, body, tg)...)
	}
	return out
}

func parseExposition(t *testing.T, body []byte, tg target) scrape {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics of %s: %v", tg.pod, err)
	}
	var out scrape
	add := func(name string, m *dto.Metric, v float64, extra ...string) {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set(labels.MetricName, name)
		b.Set("namespace", tg.namespace)
		b.Set("pod", tg.pod)
		b.Set("instance", tg.addr)
		for _, lp := range m.GetLabel() {
			b.Set(lp.GetName(), lp.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			b.Set(extra[i], extra[i+1])
		}
		out = append(out, sample{lbls: b.Labels(), v: v})
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, m, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", m, float64(b.GetCumulativeCount()), "le", formatLe(b.GetUpperBound()))
				}
				add(name+"_bucket", m, float64(h.GetSampleCount()), "le", "+Inf")
				add(name+"_sum", m, h.GetSampleSum())
				add(name+"_count", m, float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				add(name+"_sum", m, s.GetSampleSum())
				add(name+"_count", m, float64(s.GetSampleCount()))
			}
		}
	}
	return out
}

func formatLe(f float64) string {
	if math.IsInf(f, +1) {
		return "+Inf"
	}
	return model.SampleValue(f).String()
}

// names returns the metric names of the scrape.
func (s scrape) names() map[string]bool {
	out := map[string]bool{}
	for _, smp := range s {
		out[smp.lbls.Get(labels.MetricName)] = true
	}
	return out
}

// timeline is scrapes placed at the times Prometheus would have taken them.
type timeline struct {
	at []time.Time
	sc []scrape
}

func (tl *timeline) add(at time.Time, s scrape) { tl.at = append(tl.at, at); tl.sc = append(tl.sc, s) }

// shifted returns the same scrapes placed so that the last is at end.
func (tl timeline) shifted(end time.Time) timeline {
	d := end.Sub(tl.at[len(tl.at)-1])
	out := timeline{sc: tl.sc}
	for _, at := range tl.at {
		out.at = append(out.at, at.Add(d))
	}
	return out
}

// evaluator evaluates PromQL over a timeline, with Prometheus's own TSDB
// and engine.
type evaluator struct {
	t      *testing.T
	st     *teststorage.TestStorage
	engine *promql.Engine
	end    time.Time
}

func newEvaluator(t *testing.T, tl timeline) *evaluator {
	t.Helper()
	st := teststorage.New(t)
	ctx := context.Background()
	for i, sc := range tl.sc {
		app := st.Appender(ctx)
		for _, smp := range sc {
			if _, err := app.Append(0, smp.lbls, tl.at[i].UnixMilli(), smp.v); err != nil {
				t.Fatalf("append %s: %v", smp.lbls, err)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return &evaluator{t: t, st: st, engine: promqltest.NewTestEngine(t, false, 5*time.Minute, 1e6), end: tl.at[len(tl.at)-1]}
}

// firing returns the series the expression yields at the last scrape (an
// alert's expression "fires" when it yields any), as sorted label strings.
func (e *evaluator) firing(expr string) []string {
	e.t.Helper()
	ctx := context.Background()
	q, err := e.engine.NewInstantQuery(ctx, e.st, nil, expr, e.end)
	if err != nil {
		e.t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		e.t.Fatalf("%s: %v", expr, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		e.t.Fatalf("%s: %v", expr, err)
	}
	var out []string
	for _, s := range vec {
		out = append(out, fmt.Sprintf("%s=%g", s.Metric, s.F))
	}
	sort.Strings(out)
	return out
}
