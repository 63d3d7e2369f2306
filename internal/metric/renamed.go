package metric

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Rename is a metric whose name changed: /metrics exports it under both
// names until the release RemovedIn, so that dashboards and alerts written
// for the old name keep working through one upgrade.
type Rename struct {
	Old, New  string
	RemovedIn string // the release that stops exporting Old
}

// Renames lists every renamed metric (issue 34: one `meshid_<component>_`
// prefix per component, the agent's rotation failures apart from its CA
// request failures). docs/reference/metrics.md lists them as deprecated.
var Renames = []Rename{
	{Old: "meshid_jwtsvid_issued_total", New: "meshid_ca_jwtsvid_issued_total", RemovedIn: "0.2.0"},
	{Old: "meshid_impersonations_total", New: "meshid_ca_impersonations_total", RemovedIn: "0.2.0"},
	{Old: "meshid_jwt_key_leader", New: "meshid_ca_jwt_key_leader", RemovedIn: "0.2.0"},
	{Old: "meshid_jwt_key_secret_loads_total", New: "meshid_ca_jwt_key_secret_loads_total", RemovedIn: "0.2.0"},
	{Old: "meshid_jwt_key_secret_writes_total", New: "meshid_ca_jwt_key_secret_writes_total", RemovedIn: "0.2.0"},
	{Old: "meshid_workloadapi_streams", New: "meshid_agent_workloadapi_streams", RemovedIn: "0.2.0"},
	{Old: "meshid_workloadapi_refused_total", New: "meshid_agent_workloadapi_refused_total", RemovedIn: "0.2.0"},
	{Old: "meshid_workloadapi_pushes_total", New: "meshid_agent_workloadapi_pushes_total", RemovedIn: "0.2.0"},
	{Old: "meshid_agent_ca_failures_total", New: "meshid_agent_rotation_failures_total", RemovedIn: "0.2.0"},
}

// DeprecatedHelp is the help text of a metric's old name.
func DeprecatedHelp(r Rename) string {
	return "Deprecated: renamed " + r.New + ", which has the same series; this name is removed in " + r.RemovedIn + "."
}

// WithRenames returns a Gatherer that gathers g and adds, for each family
// renamed in Renames, the same series under the old name. The CA's and
// the agent's /metrics serve through it.
func WithRenames(g prometheus.Gatherer) prometheus.Gatherer { return renamed{g} }

type renamed struct{ g prometheus.Gatherer }

func (r renamed) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := r.g.Gather()
	n := len(mfs)
	for _, mf := range mfs[:n] {
		for _, rn := range Renames {
			if mf.GetName() != rn.New {
				continue
			}
			name, help := rn.Old, DeprecatedHelp(rn)
			mfs = append(mfs, &dto.MetricFamily{
				Name:   &name,
				Help:   &help,
				Type:   mf.Type,
				Unit:   mf.Unit,
				Metric: mf.Metric, // shared: the encoder only reads it
			})
		}
	}
	if len(mfs) > n {
		slices.SortFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
	return mfs, err
}
