package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// maxResponse bounds an answer the client reads.
const maxResponse = 1 << 20

// Client calls the admin API on a Unix socket.
type Client struct {
	http *http.Client
}

// NewClient returns a client of the socket at path.
func NewClient(path string, timeout time.Duration) *Client {
	var d net.Dialer
	return &Client{http: &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			},
		},
	}}
}

// Status returns where the rotation stands.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodGet, "/v1/status")
}

// Activate activates the prepared CA and returns the new status.
func (c *Client) Activate(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/v1/activate")
}

// RotateRoot prepares a new self-signed root and returns the new status.
func (c *Client) RotateRoot(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, "/v1/rotate-root")
}

func (c *Client) call(ctx context.Context, method, path string) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, method, "http://meshid-admin"+path, nil)
	if err != nil {
		return st, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return st, fmt.Errorf("admin socket: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return st, fmt.Errorf("admin socket: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return st, fmt.Errorf("%s", e.Error)
		}
		return st, fmt.Errorf("admin socket: %s", resp.Status)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("admin socket: bad answer: %w", err)
	}
	return st, nil
}
