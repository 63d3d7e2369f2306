package cryptobound_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/bench/cryptobound"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

func TestMeasure(t *testing.T) {
	tests := []struct {
		leaf, ca certs.KeyType
	}{
		{certs.ECP256, certs.ECP256},
		{certs.RSA2048, certs.ECP256},
		{certs.ECP256, certs.ECP384},
		{certs.Ed25519, certs.RSA2048},
	}
	for _, tt := range tests {
		t.Run(string(tt.leaf)+"/"+string(tt.ca), func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1e9, 0))
			type result struct {
				res *cryptobound.Result
				err error
			}
			done := make(chan result, 1)
			cpu := time.Duration(0)
			go func() {
				res, err := cryptobound.Measure(context.Background(), cryptobound.Config{
					LeafKeyType: tt.leaf, CAKeyType: tt.ca, Workers: 2, Duration: time.Second, Clock: clk,
					CPU: func() (time.Duration, error) { cpu += 3 * time.Second; return cpu, nil }, // 3s per read
				})
				done <- result{res, err}
			}()
			stop := make(chan struct{})
			defer close(stop)
			clk.WaitForWaiters(1, stop)
			clk.Add(time.Second)
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.res.Elapsed != time.Second || r.res.Operations < 2 || r.res.PerSecond != float64(r.res.Operations) ||
				r.res.Workers != 2 || r.res.LeafKeyType != tt.leaf || r.res.CAKeyType != tt.ca ||
				r.res.CPU != 3*time.Second || r.res.CPUPerOp != 3*time.Second/time.Duration(r.res.Operations) {
				t.Errorf("result = %+v", r.res)
			}
		})
	}
}

func TestMeasureErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cryptobound.Measure(ctx, cryptobound.Config{Workers: 1}); err != context.Canceled {
		t.Errorf("canceled: err = %v", err)
	}
	if _, err := cryptobound.Measure(context.Background(), cryptobound.Config{CAKeyType: "dsa"}); err == nil || !strings.HasPrefix(err.Error(), "cryptobound: ") {
		t.Errorf("bad key type: err = %v", err)
	}
	if _, err := cryptobound.Measure(context.Background(), cryptobound.Config{Workers: -1}); err == nil {
		t.Errorf("negative workers accepted")
	}
}
