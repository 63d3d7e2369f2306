package sdsload

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// RotatePath is the agent's admin endpoint that forces a rotation of the
// workload certificate (POST).
const RotatePath = "/debug/rotate"

// HTTPRotate returns a Rotate function that POSTs to http://<addr>/debug/rotate
// on the agent's monitoring address and expects a 2xx answer.
func HTTPRotate(client *http.Client, addr string) func(context.Context) error {
	if client == nil {
		client = http.DefaultClient
	}
	url := "http://" + addr + RotatePath
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			return fmt.Errorf("sdsload: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("sdsload: %w", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("sdsload: POST %s: %s: %s", url, resp.Status, body)
		}
		return nil
	}
}
