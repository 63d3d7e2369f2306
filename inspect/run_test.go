package inspect_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
)

// TestRunSources: served secrets from a Source are verified against the
// bundles served with them, files and stdin are read after them, and the
// verdict is the report's Err.
func TestRunSources(t *testing.T) {
	m := newMesh(t)
	src := func(context.Context) ([]*inspect.Input, error) {
		return inspect.ServedInputs([]inspect.Served{
			{Name: "default", Chain: []*x509.Certificate{m.leaf, m.inter.cert}, Key: m.leafKey},
			{Name: "ROOTCA", Roots: []*x509.Certificate{m.root.cert}},
		}), nil
	}
	var out bytes.Buffer
	rep, err := inspect.Run(context.Background(), inspect.Config{
		Sources: []inspect.Source{src},
		Paths:   []string{"-"},
		Stdin:   bytes.NewReader(certs.EncodeCertificates(m.root.cert)),
		Options: inspect.Options{Now: now, ExpiresWithin: 24 * time.Hour},
		Format:  inspect.FormatJSON,
		Out:     &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 || rep.Results[0].VerifiedAgainst != "ROOTCA" || rep.Results[2].Name != "stdin" {
		t.Fatalf("results %+v", rep.Results)
	}
	if rep.Status != inspect.StatusExpiring || rep.Err() == nil || !strings.Contains(rep.Err().Error(), "1 of 3 input(s) expire within 24h") {
		t.Fatalf("status %s, err %v", rep.Status, rep.Err())
	}
	if rep.ExitCode() != inspect.ExitExpiring {
		t.Fatalf("exit code %d, want %d", rep.ExitCode(), inspect.ExitExpiring)
	}
	var decoded inspect.Report
	if err := json.Unmarshal(out.Bytes(), &decoded); err != nil || len(decoded.Results) != 3 {
		t.Fatalf("JSON output: %v", err)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	fail := func(context.Context) ([]*inspect.Input, error) { return nil, errors.New("inspect: SDS down") }
	for name, cfg := range map[string]inspect.Config{
		"bad format":     {Format: "yaml", Paths: []string{dir}},
		"source fails":   {Sources: []inspect.Source{fail}},
		"roots is a dir": {RootsFile: dir, Paths: []string{dir}},
		"no roots":       {RootsFile: filepath.Join(dir, "nope"), Paths: []string{dir}},
		"huge stdin":     {Stdin: bytes.NewReader(bytes.Repeat([]byte("A"), inspect.MaxStdin+10))},
	} {
		cfg.Out = &bytes.Buffer{}
		if _, err := inspect.Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := inspect.ParseFormat("pem"); err != nil {
		t.Error(err)
	}
}

func TestExitCode(t *testing.T) {
	for status, want := range map[inspect.Status]int{inspect.StatusOK: 0, inspect.StatusExpiring: 3, inspect.StatusInvalid: 4} {
		if got := (&inspect.Report{Status: status}).ExitCode(); got != want {
			t.Errorf("%s: exit code %d, want %d", status, got, want)
		}
	}
}
