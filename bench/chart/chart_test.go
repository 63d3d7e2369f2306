package chart_test

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/bench/chart"
)

func sample() chart.Chart {
	return chart.Chart{
		Title: "meshid CA throughput",
		Series: []chart.Series{
			{Name: "ec-p256", Points: []chart.Point{{1, 1500}, {8, 4100.6}, {64, 4300}}},
			{Name: "rsa-2048", Points: []chart.Point{{1, 1200}, {8, 3900}, {64, 4000}}},
		},
		Bound: 5000, BoundName: "raw crypto bound",
	}
}

func TestSaveSVGAndPNG(t *testing.T) {
	dir := t.TempDir()
	svgPath := filepath.Join(dir, "ca.svg")
	if err := chart.Save(svgPath, sample()); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "meshid CA throughput", "ec-p256", "rsa-2048", "4101", "raw crypto bound (5000/s)", ">64<"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("SVG lacks %q", want)
		}
	}

	pngPath := filepath.Join(dir, "ca.PNG")
	if err := chart.Save(pngPath, sample()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 200 {
		t.Errorf("PNG is %v", b)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		path string
		c    chart.Chart
		want string
	}{
		{"extension", "x.gif", sample(), "want a .svg or .png"},
		{"no points", "x.svg", chart.Chart{}, "no points"},
		{"zero concurrency", "x.svg", chart.Chart{Series: []chart.Series{{Points: []chart.Point{{0, 1}}}}}, "bad point"},
		{"negative throughput", "x.svg", chart.Chart{Series: []chart.Series{{Points: []chart.Point{{1, -1}}}}}, "bad point"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := chart.Save(filepath.Join(t.TempDir(), tt.path), tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "chart: ") {
				t.Errorf("Save error = %v, want %q", err, tt.want)
			}
		})
	}
}
