package fieldlines_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/fieldlines"
)

type inner struct {
	TTL  time.Duration
	Tags []string
}

type config struct {
	Name    string
	Inner   inner
	Logger  *slog.Logger
	Hook    func()
	Any     any
	Nothing map[string]string
	private int
}

func TestLines(t *testing.T) {
	got := fieldlines.Lines(config{
		Name:   "a",
		Inner:  inner{TTL: time.Hour, Tags: []string{"x", "y"}},
		Logger: slog.Default(),
		Any:    3,
	})
	want := []string{
		"Any=int",
		"Hook=<nil>",
		"Inner.TTL=1h0m0s",
		"Inner.Tags=[x y]",
		"Logger=*slog.Logger",
		"Name=a",
		"Nothing=<nil>",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Lines:\n got %q\nwant %q", got, want)
	}
}
