package secretcache

import "context"

// Source is what the agent's servers (sds, sds/workloadendpoint) serve from:
// the one subscription point of the cache. *Manager implements it; tests
// of a server may give it another.
type Source interface {
	// Secret returns the current secret of name, producing it if needed.
	// It returns an error wrapping ErrUnknownResource for a name it cannot
	// serve, and one wrapping ErrNotReady when the secret does not exist
	// yet.
	Secret(ctx context.Context, name string) (*Secret, error)
	// Watch calls notify, which must not block, each time name's secret
	// changes or first becomes available, until cancel is called.
	Watch(name string, notify func(*Secret)) (cancel func())
}

var _ Source = (*Manager)(nil)
