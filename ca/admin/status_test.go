package admin_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/admin"
)

// Print is JSON for scripts (-o json) and Format's text for a person.
func TestStatusPrint(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	next := now.Add(9 * time.Minute)
	st := admin.Status{Phase: "propagating", NextStep: "activate", NextStepAt: &next}
	var js bytes.Buffer
	if err := st.Print(&js, now, true); err != nil {
		t.Fatal(err)
	}
	var back admin.Status
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Phase != st.Phase || !back.NextStepAt.Equal(next) {
		t.Fatalf("JSON %q: %v %+v", js.String(), err, back)
	}
	var text bytes.Buffer
	if err := st.Print(&text, now, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "phase:     propagating\n") || !strings.Contains(text.String(), "next step: activate 2026-01-01T00:09:00Z (in 9m0s)") {
		t.Fatalf("text:\n%s", text.String())
	}
}
