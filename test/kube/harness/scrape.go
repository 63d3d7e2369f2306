package harness

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// ScrapeMetric reads one sample, name{labels} (labels as Prometheus
// prints them, `mode="local"`; "" for an unlabelled metric), from the
// /metrics page of a meshid process's monitoring address.
func ScrapeMetric(monitor, name, labels string) (float64, error) {
	resp, err := http.Get("http://" + monitor + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	want := name + " "
	if labels != "" {
		want = name + "{" + labels + "} "
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s{%s} not exposed", name, labels)
}
