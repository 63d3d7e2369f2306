package inspect

import (
	"context"
	"fmt"

	"github.com/meshid/meshid/sds/secretdump"
)

// AgentDump is the Source of a meshid agent's /debug/secrets (`meshid
// inspect --pod`): get returns the body, where names the agent in errors.
// The dump holds chains and roots, never keys, so the key/cert check is
// left out. An agent that holds nothing yet is an error carrying the
// agent's own reason.
func AgentDump(where string, get func(context.Context) ([]byte, error)) Source {
	return func(ctx context.Context) ([]*Input, error) {
		body, err := get(ctx)
		if err != nil {
			return nil, fmt.Errorf("inspect: %v", err)
		}
		d, err := secretdump.Parse(body)
		if err != nil {
			return nil, fmt.Errorf("inspect: %s: %v", where, err)
		}
		if len(d.Secrets) == 0 {
			reason := d.Reason
			if reason == "" {
				reason = "it holds no certificate"
			}
			return nil, fmt.Errorf("inspect: %s (%s) is not ready: %s", where, d.Identity, reason)
		}
		served := make([]Served, 0, len(d.Secrets))
		for _, s := range d.Secrets {
			cs, err := s.Certificates()
			if err != nil {
				return nil, fmt.Errorf("inspect: %s: %v", where, err)
			}
			if s.Type == secretdump.TypeValidationContext {
				served = append(served, Served{Name: s.Name, Roots: cs})
			} else {
				served = append(served, Served{Name: s.Name, Chain: cs})
			}
		}
		return ServedInputs(served), nil
	}
}
