package certs_test

import (
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
)

func TestRenewAt(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	tests := []struct {
		name          string
		life          time.Duration
		ratio, jitter float64
		u             float64
		want          time.Duration // offset from notBefore
	}{
		{"half, no jitter", day, 0.5, 0, 0.3, 12 * time.Hour},
		{"half, jitter low end", day, 0.5, 0.01, 0, 12*time.Hour - day/100},
		{"half, jitter middle", day, 0.5, 0.01, 0.5, 12 * time.Hour},
		{"ratio clamped above", day, 2, 0, 0.5, day},
		{"ratio clamped below", day, -1, 0, 0.5, 0},
		{"never past notAfter", day, 1, 0.01, 0.99, day},
		{"empty lifetime", 0, 0.5, 0.01, 0.5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := certs.RenewAtWith(nb, nb.Add(tc.life), tc.ratio, tc.jitter, tc.u)
			if d := got.Sub(nb); d != tc.want {
				t.Fatalf("offset = %v, want %v", d, tc.want)
			}
		})
	}
	for i := 0; i < 100; i++ {
		got := certs.RenewAt(nb, nb.Add(day), 0.5, 0.01).Sub(nb)
		if got < 12*time.Hour-day/100 || got > 12*time.Hour+day/100 {
			t.Fatalf("RenewAt offset %v outside 12h±1%%", got)
		}
	}
}
