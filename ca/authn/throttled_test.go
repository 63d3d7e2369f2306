package authn_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/testkit"
)

// answer is what apiServer does with one TokenReview request.
type answer int

const (
	answerReview   answer = iota // review the token: a service account's
	answerThrottle               // 429 with Retry-After: 0, as APF rejects
	answerFail                   // 500 without Retry-After: not retried
	answerHold                   // no answer until the client gives up
)

// apiServer is an HTTPS Kubernetes API server speaking the TokenReview API
// (protobuf request, JSON answer) whose n-th request (from 0) gets
// script(n).
type apiServer struct {
	srv    *httptest.Server
	script func(n int) answer

	mu        sync.Mutex
	requests  int
	throttled int // 429s sent
	tokens    []string
}

func newAPIServer(t *testing.T, script func(n int) answer) *apiServer {
	t.Helper()
	a := &apiServer{script: script}
	stop := make(chan struct{})
	a.srv = httptest.NewTLSServer(http.HandlerFunc(a.serve(t, stop)))
	t.Cleanup(a.srv.Close)
	t.Cleanup(func() { close(stop) }) // first: ends held requests
	return a
}

func (a *apiServer) serve(t *testing.T, stop <-chan struct{}) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		obj, _, err := kubeclient.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		review, ok := obj.(*authenticationv1.TokenReview)
		if err != nil || !ok {
			t.Errorf("API server: request body is not a TokenReview: %T %v", obj, err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		n := a.requests
		a.requests++
		a.tokens = append(a.tokens, review.Spec.Token)
		act := a.script(n)
		if act == answerThrottle {
			a.throttled++
		}
		a.mu.Unlock()
		switch act {
		case answerThrottle:
			w.Header().Set("Retry-After", "0")
			writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "too many requests, please try again later")
		case answerFail:
			writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, "etcd down")
		case answerHold:
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		default:
			out := review.DeepCopy()
			out.TypeMeta = metav1.TypeMeta{Kind: "TokenReview", APIVersion: "authentication.k8s.io/v1"}
			out.Status = saStatus("ns", "sa", review.Spec.Audiences...)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		}
	}
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg,
	})
}

func (a *apiServer) counts() (requests, throttled int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests, a.throttled
}

// reviewer is a TokenReview on the CA's real TokenReview client (the Auth
// client of ca/kubeclient, built from a kubeconfig) talking to a.
func (a *apiServer) reviewer(t *testing.T, timeout time.Duration) (*authn.TokenReview, *prometheus.Registry, *testkit.LogRecorder) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: a.srv.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "the-ca-credential"}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: path})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	logs := testkit.NewLogRecorder()
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cs.Auth, Timeout: timeout, Registerer: reg, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return tr, reg, logs
}

// message is the caller's message of a *ca.Error.
func message(t *testing.T, err error) string {
	t.Helper()
	var e *ca.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *ca.Error", err)
	}
	return e.Msg
}

// The API server rejects a review with 429 a few times, then answers:
// client-go retries, the review succeeds, and the CA's counter has every
// 429 the API server sent.
func TestTokenReviewThrottledThenReviewed(t *testing.T) {
	const rejections = 3
	api := newAPIServer(t, func(n int) answer {
		if n < rejections {
			return answerThrottle
		}
		return answerReview
	})
	tr, reg, _ := api.reviewer(t, 0)
	token := mint(t, newIssuer(t), "ns", "sa", []string{"istio-ca"}, time.Hour, time.Now())
	c, err := tr.Authenticate(context.Background(), authn.Credentials{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace != "ns" || c.ServiceAccount != "sa" {
		t.Fatalf("caller %+v", c)
	}
	requests, throttled := api.counts()
	if requests != rejections+1 || throttled != rejections {
		t.Fatalf("the API server got %d requests, answered %d with 429; want %d and %d", requests, throttled, rejections+1, rejections)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_throttled_total"); got != rejections {
		t.Errorf("meshid_ca_tokenreview_throttled_total %v, the API server answered %d with 429", got, rejections)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_requests_total", "result", "authenticated"); got != 1 {
		t.Errorf("authenticated reviews %v, want 1", got)
	}
	for i, tok := range api.tokens {
		if tok != token {
			t.Errorf("attempt %d sent another token", i+1)
		}
	}
}

// A review the API server keeps throttling fails Unavailable, uncached,
// with a message (to the caller and in the CA's log) that says it was
// throttled and how often, whichever way it ends: client-go's retries run
// out (it answers with the last 429), or the review's timeout does.
func TestTokenReviewThrottledFails(t *testing.T) {
	tests := []struct {
		name    string
		script  func(n int) answer
		timeout time.Duration
		want    string // the end of the message
	}{
		{
			name:   "client-go stops retrying",
			script: func(int) answer { return answerThrottle },
			want:   " until client-go stopped retrying",
		},
		{
			name: "timeout",
			script: func(n int) answer {
				if n < 2 {
					return answerThrottle
				}
				return answerHold
			},
			timeout: 300 * time.Millisecond,
			want:    " and it did not finish within 300ms",
		},
		{
			name: "another failure after",
			script: func(n int) answer {
				if n < 4 {
					return answerThrottle
				}
				return answerFail
			},
			want: ", then could not review the token",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPIServer(t, tc.script)
			tr, reg, logs := api.reviewer(t, tc.timeout)
			token := mint(t, newIssuer(t), "ns", "sa", []string{"istio-ca"}, time.Hour, time.Now())
			_, err := tr.Authenticate(context.Background(), authn.Credentials{Token: token})
			wantKind(t, err, ca.KindUnavailable, token)
			_, throttled := api.counts()
			if throttled < 1 {
				t.Fatalf("the API server answered %d requests with 429", throttled)
			}
			times := fmt.Sprintf("%d times", throttled)
			if throttled == 1 {
				times = "once"
			}
			want := "tokenreview: the Kubernetes API server throttled the review (HTTP 429, " + times + ")" + tc.want
			if msg := message(t, err); msg != want {
				t.Errorf("message %q, want %q", msg, want)
			}
			if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_throttled_total"); got != float64(throttled) {
				t.Errorf("meshid_ca_tokenreview_throttled_total %v, the API server answered %d with 429", got, throttled)
			}
			if n := logs.CountContaining("throttled it http_429=" + fmt.Sprint(throttled)); n != 1 {
				t.Errorf("%d warnings name the throttling; the log: %s", n, logs.All())
			}
			if strings.Contains(logs.All(), token) {
				t.Error("the log holds the token")
			}
			// Not cached: the next call reviews again.
			before, _ := api.counts()
			_, err = tr.Authenticate(context.Background(), authn.Credentials{Token: token})
			wantKind(t, err, ca.KindUnavailable, token)
			if after, _ := api.counts(); after == before {
				t.Error("a throttled review's failure was cached")
			}
		})
	}
}

// Without a 429 the message is the one of any failed review, and nothing
// is counted as throttled.
func TestTokenReviewFailsUnthrottled(t *testing.T) {
	api := newAPIServer(t, func(int) answer { return answerFail })
	tr, reg, logs := api.reviewer(t, 0)
	_, err := tr.Authenticate(context.Background(), authn.Credentials{Token: "opaque-7d2e"})
	wantKind(t, err, ca.KindUnavailable, "opaque-7d2e")
	if msg := message(t, err); msg != "tokenreview: the Kubernetes API server could not review the token" {
		t.Errorf("message %q", msg)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_throttled_total"); got != 0 {
		t.Errorf("meshid_ca_tokenreview_throttled_total %v without a 429", got)
	}
	if n := logs.CountContaining("throttled"); n != 0 {
		t.Errorf("the log names throttling without a 429: %s", logs.All())
	}
}
