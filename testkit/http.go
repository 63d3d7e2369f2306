package testkit

import (
	"io"
	"net/http"
	"testing"
)

// HTTP sends a bodiless method request to url (a monitoring endpoint:
// /metrics, /readyz, /debug/rotate) and returns the status code and the
// body. It fails t when the request fails or takes longer than Guard.
func HTTP(t testing.TB, method, url string) (code int, body string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: Guard}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
