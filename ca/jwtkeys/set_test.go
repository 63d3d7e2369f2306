package jwtkeys_test

import (
	"testing"
	"time"

	"github.com/meshid/meshid/ca/jwtkeys"
)

const (
	life = time.Hour
	ttl  = 5 * time.Minute
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func rotate(t *testing.T, s *jwtkeys.Set, now time.Time) (*jwtkeys.Set, bool) {
	t.Helper()
	next, changed, err := jwtkeys.Rotate(s, now, life, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return next, changed
}

func ids(keys []jwtkeys.Key) []string {
	out := make([]string, len(keys))
	for n, k := range keys {
		out[n] = k.ID
	}
	return out
}

func TestRotateSchedule(t *testing.T) {
	s, changed := rotate(t, nil, t0)
	if !changed || len(s.Keys) != 2 {
		t.Fatalf("a new Set: changed %v, %d keys, want the signing key and the next", changed, len(s.Keys))
	}
	cur, next := s.Keys[0], s.Keys[1]
	if k, _ := s.Signing(t0); k.ID != cur.ID || !next.From.Equal(cur.Until) || cur.Until.Sub(cur.From) != life {
		t.Fatalf("keys %+v / %+v", cur, next)
	}
	if again, changed := rotate(t, s, t0.Add(life-time.Second)); changed || again != s {
		t.Error("a Set rotated before its key stopped signing")
	}
	// A reader of the Set alone (a replica that is not the leader) signs
	// with the pre-published next key as soon as the first one retires.
	if k, ok := s.Signing(t0.Add(life)); !ok || k.ID != next.ID {
		t.Errorf("at the first key's end the signing key is %s, want %s", k.ID, next.ID)
	}
	if got := s.NextChange(t0, ttl); !got.Equal(cur.Until) {
		t.Errorf("NextChange = %s, want %s", got, cur.Until)
	}
	s2, changed := rotate(t, s, t0.Add(life))
	if !changed || len(s2.Keys) != 3 || s2.Keys[0].ID != cur.ID || s2.Keys[1].ID != next.ID {
		t.Fatalf("after one lifetime: %v", ids(s2.Keys))
	}
	// The retired key stays published for its last token, then goes.
	if got := ids(s2.Published(t0.Add(life+ttl-time.Second), ttl)); len(got) != 3 {
		t.Errorf("published before the last token expired: %v", got)
	}
	s3, changed := rotate(t, s2, t0.Add(life+ttl))
	if !changed || len(s3.Keys) != 2 || s3.Keys[0].ID != next.ID {
		t.Errorf("after the retired key's last token: %v", ids(s3.Keys))
	}
	// A Set left alone for many lifetimes starts over.
	s4, changed := rotate(t, s3, t0.Add(100*life))
	if k, ok := s4.Signing(t0.Add(100 * life)); !changed || !ok || len(s4.Keys) != 2 || k.ID == next.ID {
		t.Errorf("after a jump: %v", ids(s4.Keys))
	}
}

func TestSigningOfNothing(t *testing.T) {
	var s *jwtkeys.Set
	if _, ok := s.Signing(t0); ok {
		t.Error("a nil Set signs")
	}
	if s.Published(t0, ttl) != nil {
		t.Error("a nil Set publishes")
	}
}
