package harness

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// CheckGoMemLimit reports why container c of a manifest (deploy/ or the
// chart) does not set GOMEMLIMIT to its own memory limit in bytes: the env
// var must come from the downward API's limits.memory of c itself, with no
// divisor other than 1 (GOMEMLIMIT reads a bare number as bytes: a divisor
// of 1Mi would make 512Mi a 512-byte limit), and c must have a memory
// limit (without one the downward API gives the node's memory).
func CheckGoMemLimit(c corev1.Container) error {
	if c.Resources.Limits.Memory().IsZero() {
		return fmt.Errorf("container %s has no memory limit", c.Name)
	}
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil {
			return fmt.Errorf("GOMEMLIMIT is not read from the downward API: %+v", e)
		}
		r := e.ValueFrom.ResourceFieldRef
		one := resource.MustParse("1")
		switch {
		case r.Resource != "limits.memory":
			return fmt.Errorf("GOMEMLIMIT from %s, want limits.memory", r.Resource)
		case r.ContainerName != "" && r.ContainerName != c.Name:
			return fmt.Errorf("GOMEMLIMIT from container %s's limit, want %s's", r.ContainerName, c.Name)
		case !r.Divisor.IsZero() && r.Divisor.Cmp(one) != 0:
			return fmt.Errorf("GOMEMLIMIT with divisor %s: the runtime would read it as bytes", r.Divisor.String())
		}
		return nil
	}
	return fmt.Errorf("container %s does not set GOMEMLIMIT", c.Name)
}
