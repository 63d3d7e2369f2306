package chart

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/meshid/meshid/certs"
)

// Point is one measurement: a concurrency level and the throughput there.
type Point struct {
	Concurrency int
	Throughput  float64
}

// Series is one line of the chart, such as one key type.
type Series struct {
	Name   string
	Points []Point
}

// Chart describes the picture.
type Chart struct {
	Title  string
	YLabel string // default "certificates/s"
	Series []Series
	// Bound, when positive, is drawn as a dashed horizontal line named
	// BoundName, e.g. the in-process raw crypto bound.
	Bound     float64
	BoundName string
}

// Size of the picture.
const (
	Width  = 16 * vg.Centimeter
	Height = 10 * vg.Centimeter
)

// FormatOf returns "svg" or "png" for a file name, or an error for any other
// extension.
func FormatOf(path string) (string, error) {
	switch ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), ".")); ext {
	case "svg", "png":
		return ext, nil
	default:
		return "", fmt.Errorf("chart: %q: want a .svg or .png file", path)
	}
}

// Save writes the chart to path (atomically), in the format its extension
// names.
func Save(path string, c Chart) error {
	format, err := FormatOf(path)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := Write(&buf, format, c); err != nil {
		return err
	}
	if err := certs.WriteFileAtomic(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}

// Write renders the chart as format ("svg" or "png") to w.
func Write(w io.Writer, format string, c Chart) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	wt, err := p.WriterTo(Width, Height, format)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}

func (c Chart) plot() (*plot.Plot, error) {
	var levels []int
	var top float64
	for _, s := range c.Series {
		for _, pt := range s.Points {
			if pt.Concurrency <= 0 || math.IsNaN(pt.Throughput) || math.IsInf(pt.Throughput, 0) || pt.Throughput < 0 {
				return nil, fmt.Errorf("chart: bad point %+v in series %q", pt, s.Name)
			}
			levels = append(levels, pt.Concurrency)
			top = max(top, pt.Throughput)
		}
	}
	if len(levels) == 0 {
		return nil, errors.New("chart: no points")
	}
	slices.Sort(levels)
	levels = slices.Compact(levels)

	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = "concurrency (requests in flight)"
	p.Y.Label.Text = c.YLabel
	if p.Y.Label.Text == "" {
		p.Y.Label.Text = "certificates/s"
	}
	p.X.Scale = plot.LogScale{}
	ticks := make(plot.ConstantTicks, len(levels))
	for i, l := range levels {
		ticks[i] = plot.Tick{Value: float64(l), Label: strconv.Itoa(l)}
	}
	p.X.Tick.Marker = ticks
	// Pad the x range by a quarter of a doubling on each side so that the
	// end points and their labels are not on the frame.
	p.X.Min, p.X.Max = float64(levels[0])/math.Pow(2, 0.25), float64(levels[len(levels)-1])*math.Pow(2, 0.25)
	p.Y.Min, p.Y.Max = 0, max(top, c.Bound)*1.15
	p.Y.Tick.Marker = integerTicks{}
	p.Add(plotter.NewGrid())
	// Bottom right: below the lines, which rise with concurrency.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -2*vg.Millimeter, 2*vg.Millimeter

	for i, s := range c.Series {
		xys := make(plotter.XYs, len(s.Points))
		labels := make([]string, len(s.Points))
		for j, pt := range s.Points {
			xys[j] = plotter.XY{X: float64(pt.Concurrency), Y: pt.Throughput}
			labels[j] = strconv.FormatFloat(pt.Throughput, 'f', 0, 64)
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		col := plotutil.Color(i)
		line.Color, points.Color = col, col
		points.Shape = draw.CircleGlyph{}
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		for k := range lbl.TextStyle {
			lbl.TextStyle[k].Color = col
		}
		// Label the first series above its points, the next below, and so on.
		lbl.Offset = vg.Point{X: -4 * vg.Millimeter, Y: 2 * vg.Millimeter}
		if i%2 == 1 {
			lbl.Offset.Y = -5 * vg.Millimeter
		}
		p.Add(line, points, lbl)
		if s.Name != "" {
			p.Legend.Add(s.Name, line, points)
		}
	}
	if c.Bound > 0 {
		bound, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: c.Bound}, {X: p.X.Max, Y: c.Bound}})
		if err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
		bound.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		bound.Color = plotutil.Color(len(c.Series))
		p.Add(bound)
		name := c.BoundName
		name = cmp.Or(name, "bound")
		p.Legend.Add(fmt.Sprintf("%s (%.0f/s)", name, c.Bound), bound)
	}
	return p, nil
}

// integerTicks are gonum's default ticks labelled without decimals.
type integerTicks struct{}

func (integerTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', 0, 64)
		}
	}
	return ticks
}
