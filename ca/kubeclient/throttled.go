package kubeclient

import (
	"context"
	"net/http"
)

// throttledKey is the context key of OnThrottled's function.
type throttledKey struct{}

// OnThrottled returns a copy of ctx with which a request of a client that
// counts its throttling (Auth, or a rest.Config wrapped with
// CountThrottled) calls f once for every HTTP 429 Too Many Requests the API
// server answers: the flow control (APF) rejecting it. client-go retries
// such an answer after its Retry-After, within ctx, without reporting it;
// f is called for each attempt, the retried ones included. f may be called
// from the goroutine sending the request, never at once from two for one
// call of the client (client-go makes the attempts one after the other).
func OnThrottled(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, throttledKey{}, f)
}

// CountThrottled wraps rt so that its requests call the function of
// OnThrottled on every 429 answer; requests without one are untouched. It
// is a rest.Config.Wrap function: NewClients wraps the Auth client's transport
// with it.
func CountThrottled(rt http.RoundTripper) http.RoundTripper {
	return throttleCounter{next: rt}
}

type throttleCounter struct{ next http.RoundTripper }

func (c throttleCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if f, ok := req.Context().Value(throttledKey{}).(func()); ok && f != nil {
			f()
		}
	}
	return resp, err
}
