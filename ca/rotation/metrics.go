package rotation

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the rotation's state at scrape time, so that a root
// that left the bundle leaves the metrics with it.
type collector struct{ r *Manager }

var (
	phaseDesc = prometheus.NewDesc("meshid_ca_rotation_phase",
		"CA rotation phase: 1 for the current phase (stable, prepared, active), 0 for the others.",
		[]string{"phase"}, nil)
	stuckDesc = prometheus.NewDesc("meshid_ca_rotation_stuck",
		"1 when the last new CA offered was refused or a rotation step failed (the current CA keeps signing; the log and `meshid inspect --ca` say why).",
		nil, nil)
	rootDesc = prometheus.NewDesc("meshid_ca_bundle_root_expiry_timestamp_seconds",
		"Expiry (Unix time) of each root in the trust bundle, by subject, serial and state (current, next, retiring).",
		[]string{"subject", "serial", "state"}, nil)
	nextDesc = prometheus.NewDesc("meshid_ca_rotation_next_step_timestamp_seconds",
		"Unix time of the next timed rotation step (activate, retire, rotate-root); absent when none is scheduled.",
		[]string{"step"}, nil)
	stepsDesc = prometheus.NewDesc("meshid_ca_rotation_steps_total",
		"Rotation steps taken since start: prepared, activated, switched (an intermediate under a trusted root), retired, refused, root_created, restored (a saved state taken up at start), followed (the leader's state taken up by a replica).",
		[]string{"step"}, nil)
)

var stepNames = []string{"prepared", "activated", "switched", "retired", "refused", "root_created", stepRestored, stepFollowed}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{phaseDesc, stuckDesc, rootDesc, nextDesc, stepsDesc} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Status()
	for _, p := range Phases {
		v := 0.0
		if p == st.Phase {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(phaseDesc, prometheus.GaugeValue, v, p.String())
	}
	stuck := 0.0
	if st.Stuck != "" {
		stuck = 1
	}
	ch <- prometheus.MustNewConstMetric(stuckDesc, prometheus.GaugeValue, stuck)
	for _, root := range st.Roots {
		ch <- prometheus.MustNewConstMetric(rootDesc, prometheus.GaugeValue, float64(root.Cert.NotAfter.Unix()),
			root.Cert.Subject.String(), root.Cert.SerialNumber.Text(16), root.State)
	}
	if st.NextStep != "" {
		ch <- prometheus.MustNewConstMetric(nextDesc, prometheus.GaugeValue, float64(st.NextStepAt.Unix()), st.NextStep)
	}
	for _, s := range stepNames {
		ch <- prometheus.MustNewConstMetric(stepsDesc, prometheus.CounterValue, float64(st.Steps[s]), s)
	}
}
