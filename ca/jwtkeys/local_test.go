package jwtkeys_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/internal/clock"
)

func TestLocalKeepsItsKeysAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(t0)
	cfg := jwtkeys.LocalConfig{Dir: dir, Lifetime: life, TTL: ttl, Clock: clk}
	first, err := jwtkeys.NewLocal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := first.Keys()
	path := filepath.Join(dir, jwtkeys.FileName)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v, want 0600", err, fi.Mode())
	}
	clk.Add(life / 2)
	restarted, err := jwtkeys.NewLocal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := restarted.Keys()
	k1, _ := before.Signing(clk.Now())
	k2, _ := after.Signing(clk.Now())
	if k1.ID != k2.ID || !k1.Private.Equal(k2.Private) {
		t.Errorf("a restart changed the signing key %s to %s", k1.ID, k2.ID)
	}
	// A rotation is saved too.
	clk.Add(life)
	rotated, _ := restarted.Keys()
	again, err := jwtkeys.NewLocal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Keys(); strings.Join(ids(got.Keys), ",") != strings.Join(ids(rotated.Keys), ",") {
		t.Errorf("after a rotation and a restart: %v, want %v", ids(got.Keys), ids(rotated.Keys))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want only %s (no temporary file left)", len(entries), jwtkeys.FileName)
	}
}

func TestLocalRefusesABadFileAndBadConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, jwtkeys.FileName), []byte(`{"version":1,"keys":[{"jwk":{"kty":"oct","k":"c2VjcmV0"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := jwtkeys.NewLocal(jwtkeys.LocalConfig{Dir: dir, TTL: ttl})
	if err == nil || !strings.Contains(err.Error(), jwtkeys.FileName) || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Errorf("a symmetric key on disk: err = %v, want an error naming the file without its content", err)
	}
	for name, cfg := range map[string]jwtkeys.LocalConfig{
		"no ttl":        {},
		"short life":    {TTL: ttl, Lifetime: jwtkeys.MinLifetime - time.Second},
		"long life":     {TTL: ttl, Lifetime: jwtkeys.MaxLifetime + time.Second},
		"negative life": {TTL: ttl, Lifetime: -time.Hour},
	} {
		if _, err := jwtkeys.NewLocal(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	l, err := jwtkeys.NewLocal(jwtkeys.LocalConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := l.Keys()
	if d := s.Keys[0].Until.Sub(s.Keys[0].From); d != jwtkeys.DefaultLifetime {
		t.Errorf("default lifetime %s", d)
	}
}
