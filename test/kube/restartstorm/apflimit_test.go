package restartstorm_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

// caLevel names the priority level and FlowSchema of
// deploy/30-flowcontrol.yaml.
const caLevel = "meshid-ca-tokenreviews"

const (
	// throttledTokens is the storm of TestPastAPFLimitRetryableThenSigned:
	// that many pods restart at once, each with a fresh token and a CSR
	// sent at once (no client pool: every restarting pod's agent asks as
	// soon as it starts).
	throttledTokens = 1000
	// raisedQPS is the CA's --kube-qps in that test, --kube-burst twice
	// it: so high that client-go's bucket never makes a review wait.
	raisedQPS = 100000
)

// TestPastAPFLimitRetryableThenSigned is a restart storm against a CA whose
// TokenReview client limit (--kube-qps, --kube-burst) is raised so far that
// the API server's flow control is the limit: APF queues the CA's reviews
// in its priority level and rejects what does not fit with 429 and a
// Retry-After. client-go waits out the Retry-After and tries again (up to
// ten times) within the CA's review timeout; what it cannot get through in
// time must reach the pod's agent as a retryable code (Unavailable or
// ResourceExhausted) with a message naming the cause, never as
// Unauthenticated, PermissionDenied or Internal for a valid token. Each
// caller retries like an agent (Istio's pilot-agent: those codes, with
// exponential backoff and jitter) and every token ends up signed. The CA
// stays ready, answers every failure it counts, and logs no token.
//
// The API server's own counters must show that APF rejected some of the
// CA's reviews during the storm: otherwise the test did not exercise the
// case, and fails.
//
// What reaches the CA when the retries run out is client-go's "context
// deadline exceeded", not the 429 (client-go keeps no response of an
// attempt it retried): the mapping of a 429 proper is ca/authn's
// TestTokenReviewDecisions. Mapping every failed review to Unauthenticated,
// as Istio's CA does, fails this test (checked with go test -overlay: 117
// of 1,000 CSRs refused, never signed). The CA's TokenReview transport
// sees every 429 though: meshid_ca_tokenreview_throttled_total must equal
// the 429s the API server counts having sent it, and a failed review that
// was throttled must say so in its message (without the transport's count,
// checked with -overlay, both fail).
func TestPastAPFLimitRetryableThenSigned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reqs := fleet(t, "apf-storm", throttledTokens)
	throttleCALevel(t, ctx)

	logs := testkit.NewLogRecorder()
	reg := prometheus.NewRegistry()
	// The CA assembly `meshid server` runs, configured as its flags
	// configure it: --kubeconfig, --token-verification tokenreview,
	// --kube-qps, --kube-burst (cmd/meshid/server.go), and
	// --publish-root-configmap=false.
	srv := testkit.CA(t, caserver.Config{
		TrustDomain: trustDomain,
		Kube: caserver.KubeConfig{
			Kubeconfig:           caKubeconfig,
			QPS:                  raisedQPS,
			Burst:                2 * raisedQPS,
			DisableRootConfigMap: true,
		},
		Authn: caserver.AuthnConfig{
			TokenVerification: boundtoken.ModeTokenReview,
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: "127.0.0.1:0",
		},
		Registerer: reg,
		Logger:     logs.Logger(), // every level, debug included
	})
	client := dialCA(t, srv.Addr().String(), srv.Authority().Bundle().Roots)

	before, err := cluster.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := agentStorm(ctx, client, reqs)
	after, err := cluster.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// delta is what the storm added to the API server's samples of metric.
	delta := func(metric string, labels ...string) float64 {
		return sum(t, after, metric, labels...) - sum(t, before, metric, labels...)
	}

	// What APF did to the CA's reviews during the storm.
	ours := []string{`priority_level="` + caLevel + `"`}
	rejected := delta("apiserver_flowcontrol_rejected_requests_total", ours...)
	var reasons []string
	byReason := map[string]float64{}
	for _, r := range []string{"queue-full", "time-out", "concurrency-limit", "cancelled"} {
		l := append(slices.Clone(ours), `reason="`+r+`"`)
		if d := delta("apiserver_flowcontrol_rejected_requests_total", l...); d > 0 {
			reasons = append(reasons, fmt.Sprintf("%s %v", r, d))
			byReason[r] = d
		}
	}
	tooMany := delta("apiserver_request_total", `resource="tokenreviews"`, `code="429"`)
	reviews := delta("apiserver_request_total", `resource="tokenreviews"`)
	executed := append(slices.Clone(ours), `execute="true"`)
	waited := delta("apiserver_flowcontrol_request_wait_duration_seconds_sum", executed...)
	served := `resource="tokenreviews"`
	late := delta("apiserver_request_duration_seconds_count", served) - delta("apiserver_request_duration_seconds_bucket", served, `le="5"`)
	dispatched := delta("apiserver_flowcontrol_request_wait_duration_seconds_count", executed...)
	caErrors, _ := testkit.LookupMetric(t, reg, "meshid_ca_tokenreview_requests_total", "result", "error") // absent: no review failed
	caThrottled := testkit.Metric(t, reg, "meshid_ca_tokenreview_throttled_total")
	throttledMsgs, plainMsgs, throttledIn, odd := res.unavailableMessages()

	t.Logf("%d fresh tokens, %d callers, --kube-qps %d: the API server answered %v TokenReviews, %v of them 429 (APF rejected %v: %s); %v dispatched after %.1f ms in the queue on average",
		len(reqs), len(reqs), raisedQPS, reviews, tooMany, rejected, strings.Join(reasons, ", "), dispatched, 1000*waited/max(dispatched, 1))
	t.Logf("the CA counted %v 429s (meshid_ca_tokenreview_throttled_total); of the %d Unavailable, %d name the throttling (%d 429s in all), %d do not; the API server served %v reviews in more than 5 s",
		caThrottled, len(res.unavailable), throttledMsgs, throttledIn, plainMsgs, late)
	t.Logf("CSRs: %d signed at the first attempt, %d after retries (at most %d attempts), %d not signed; %d attempts in all; failures by code %v (the CA counted %v failed reviews); e.g. %q",
		res.firstTry, res.signed-res.firstTry, res.most, len(reqs)-res.signed, res.attempts, res.byCode, caErrors, res.samples())

	if rejected == 0 || tooMany == 0 {
		t.Errorf("APF rejected %v of the CA's reviews (%v answered 429): the storm never went past the priority level's limit, so it tested nothing", rejected, tooMany)
	}
	for code, n := range res.byCode {
		msg := res.sample[code]
		switch code {
		case codes.Unavailable, codes.ResourceExhausted:
			if !strings.Contains(msg, "Kubernetes API server") {
				t.Errorf("%d CSRs failed with %v %q: the message does not name the API server as the cause", n, code, msg)
			}
		default:
			t.Errorf("%d CSRs with valid tokens failed with %v (%q), want only Unavailable or ResourceExhausted: an agent does not retry it, or retries a verdict that will not change", n, code, msg)
		}
	}
	if res.signed != len(reqs) {
		t.Errorf("signed %d of %d fresh tokens after retrying like an agent; last errors: %v", res.signed, len(reqs), res.gaveUp[:min(3, len(res.gaveUp))])
	}
	// Every failure the callers saw is one review the CA could not get
	// answered (the tokens are all different: no review is shared).
	if unavailable := res.byCode[codes.Unavailable]; float64(unavailable) != caErrors {
		t.Errorf("callers got %d Unavailable, the CA counted %v failed TokenReviews", unavailable, caErrors)
	}
	// The CA saw every 429 the API server sent it, retried ones included.
	// The API server also counts a 429 for each review APF gave up on
	// because the CA had gone (its review timeout ended while the review
	// waited in the queue: reason "cancelled"); nobody read that answer.
	if sent := tooMany - byReason["cancelled"]; caThrottled != sent {
		t.Errorf("meshid_ca_tokenreview_throttled_total %v, the API server answered %v TokenReviews with 429 (%v to a CA that had gone)",
			caThrottled, tooMany, byReason["cancelled"])
	}
	// A failed review that was throttled says so, with how often; the
	// failed reviews together cannot have had more 429s than the CA
	// counted. A review fails without a 429 the CA could read only if its
	// 10 s ran out in APF's queue (then the API server counts it
	// "cancelled") or while the API server served it (late): only that
	// many messages may be those of an unthrottled review.
	for _, m := range odd {
		t.Errorf("an Unavailable message neither names the throttling nor is the one of an unthrottled review: %q", m)
	}
	if float64(throttledIn) > caThrottled {
		t.Errorf("the Unavailable messages count %d 429s, the CA counted %v", throttledIn, caThrottled)
	}
	// The CA's warning of each such review names the throttling too.
	if n := logs.Count("TokenReview call failed: the Kubernetes API server throttled it"); n != throttledMsgs {
		t.Errorf("the CA logged %d failed reviews as throttled, the callers got %d such messages", n, throttledMsgs)
	}
	if float64(plainMsgs) > byReason["cancelled"]+late {
		t.Errorf("%d of %d Unavailable messages do not name the throttling, yet the API server answered all but %v reviews (%v given up in the queue, %v served in more than 5 s) within the CA's timeout, and %v of them with 429",
			plainMsgs, len(res.unavailable), byReason["cancelled"]+late, byReason["cancelled"], late, tooMany)
	}
	// The CA stays healthy: ready, and serving its monitoring endpoints.
	if err := srv.Ready(); err != nil {
		t.Errorf("the CA is not ready after the storm: %v", err)
	}
	if code, err := httpStatus(ctx, "http://"+srv.MonitoringAddr().String()+"/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz after the storm: %d %v", code, err)
	}
	// Whatever it logged about the failed reviews holds no token: every
	// JWT begins with the base64 of `{"`, "eyJ".
	if l := logs.All(); strings.Contains(l, "eyJ") {
		i := strings.Index(l, "eyJ")
		t.Errorf("the CA logged a token: ...%s...", l[max(0, i-200):min(len(l), i+40)])
	}
}

// throttleCALevel server-side applies a copy of deploy/30-flowcontrol.yaml's
// priority level shrunk to 1 concurrency share (3 of the API server's 600
// seats), nothing lent or borrowed, and one queue of 1, until the test ends
// (then it applies the shipped level again). Why: the shipped level has 33
// to 132 seats and queues up to 4 × 100 reviews of one flow (all the CA's
// reviews are one flow), so APF rejects only past about 500 reviews waiting
// at once; on the 2-core test machine, 2,000 fresh tokens sent at once were
// all reviewed without one rejection. Shrunk, the level holds 4 reviews and
// rejects the rest; with 1,000 tokens at once it rejects hundreds, and
// keeps rejecting some long enough that client-go's retries run out of the
// CA's review timeout. Only the sizes change: the classification, the
// level's type (Limited) and its limit response (Queue) stay the shipped
// ones.
func throttleCALevel(t *testing.T, ctx context.Context) {
	t.Helper()
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", "30-flowcontrol.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var shipped *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "PriorityLevelConfiguration" && o.GetName() == caLevel {
			shipped = o
		}
	}
	if shipped == nil {
		t.Fatalf("deploy/30-flowcontrol.yaml has no PriorityLevelConfiguration %s", caLevel)
	}
	small := shipped.DeepCopy()
	for path, v := range map[string]int64{
		"nominalConcurrencyShares":               1,
		"lendablePercent":                        0,
		"borrowingLimitPercent":                  0,
		"limitResponse.queuing.queues":           1,
		"limitResponse.queuing.handSize":         1,
		"limitResponse.queuing.queueLengthLimit": 1,
	} {
		if err := unstructured.SetNestedField(small.Object, v, append([]string{"spec", "limited"}, strings.Split(path, ".")...)...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.Apply(ctx, small); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := cluster.Apply(ctx, shipped); err != nil {
			t.Errorf("restoring the shipped priority level: %v", err)
			return
		}
		// Shipped: it lends and borrows, so its lower and upper limits differ.
		waitForLevel(t, ctx, "the shipped limits", func(nominal, lower, upper float64) bool { return lower < nominal && nominal < upper })
	})
	// The API server's APF controller digests the change asynchronously;
	// it sets the limits it reports and the queues in one step.
	waitForLevel(t, ctx, "the throttled limits", func(nominal, lower, upper float64) bool { return nominal == lower && lower == upper && upper > 0 })
}

// waitForLevel polls the API server's seat limits of the CA's priority
// level until ok accepts them.
func waitForLevel(t *testing.T, ctx context.Context, what string, ok func(nominal, lower, upper float64) bool) {
	t.Helper()
	l := `priority_level="` + caLevel + `"`
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := cluster.APIServerMetrics(ctx)
		if err != nil {
			return false, err
		}
		var seats [3]float64
		for i, name := range []string{"nominal", "lower", "upper"} {
			if seats[i], err = m.Sum("apiserver_flowcontrol_"+name+"_limit_seats", l); err != nil {
				return false, err
			}
		}
		n, lo, up := seats[0], seats[1], seats[2]
		last = fmt.Sprintf("nominal %v, lower %v, upper %v seats", n, lo, up)
		return ok(n, lo, up), nil
	})
	if err != nil {
		t.Fatalf("the API server never reported %s for %s (last: %s): %v", what, caLevel, last, err)
	}
}

// agentResult is what the callers of agentStorm saw.
type agentResult struct {
	mu          sync.Mutex
	firstTry    int                   // CSRs signed at their first attempt
	signed      int                   // CSRs signed in the end
	attempts    int                   // CreateCertificate calls
	most        int                   // the most attempts one CSR took to be signed
	byCode      map[codes.Code]int    // failed calls by code
	sample      map[codes.Code]string // one message per code
	unavailable []string              // every Unavailable message
	gaveUp      []error               // the last error of each CSR never signed
}

func (r *agentResult) samples() []string {
	var out []string
	for c, m := range r.sample {
		out = append(out, c.String()+": "+m)
	}
	slices.Sort(out)
	return out
}

// Retries of agentStorm's callers: Istio's pilot-agent retries a CSR that
// failed with Unavailable or ResourceExhausted (among others; never
// Unauthenticated or PermissionDenied) after 100 ms, doubling, with jitter,
// and its secret manager keeps trying after that. The delay is the agent's
// behaviour, not a wait for the test: no assertion depends on its length.
const (
	agentAttempts    = 12
	agentBackoffBase = 100 * time.Millisecond
	agentBackoffMax  = 5 * time.Second
)

// agentStorm sends every request at once, each retried like an agent
// until signed, refused with a code no agent retries, or agentAttempts
// used up.
func agentStorm(ctx context.Context, client securityapi.IstioCertificateServiceClient, reqs []request) *agentResult {
	res := &agentResult{byCode: map[codes.Code]int{}, sample: map[codes.Code]string{}}
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() { res.add(agentSign(ctx, client, r, res)) })
	}
	wg.Wait()
	return res
}

// signOutcome is one CSR's end: signed (at which attempt) or its last error.
type signOutcome struct {
	attempt int
	err     error
}

func (r *agentResult) add(o signOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case o.err != nil:
		r.gaveUp = append(r.gaveUp, o.err)
	case o.attempt == 1:
		r.firstTry++
		r.signed++
	default:
		r.signed++
	}
	r.most = max(r.most, o.attempt)
}

func (r *agentResult) failed(err error) {
	st := status.Convert(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byCode[st.Code()]++
	if _, ok := r.sample[st.Code()]; !ok {
		r.sample[st.Code()] = st.Message()
	}
	if st.Code() == codes.Unavailable {
		r.unavailable = append(r.unavailable, st.Message())
	}
}

// The CA's Unavailable messages for a failed review: with the API
// server's 429s (how many), or without.
var (
	throttledMessage = regexp.MustCompile(`tokenreview: the Kubernetes API server throttled the review \(HTTP 429, (once|([0-9]+) times)\)`)
	plainMessage     = "tokenreview: the Kubernetes API server could not review the token"
)

// unavailableMessages sorts the Unavailable messages: how many name the
// throttling and with how many 429s in all, how many are those of a
// review without a 429, and the others.
func (r *agentResult) unavailableMessages() (throttled, plain, tooMany int, others []string) {
	for _, m := range r.unavailable {
		switch sm := throttledMessage.FindStringSubmatch(m); {
		case sm != nil && sm[1] == "once":
			throttled++
			tooMany++
		case sm != nil:
			n, _ := strconv.Atoi(sm[2])
			throttled++
			tooMany += n
		case strings.Contains(m, plainMessage):
			plain++
		default:
			others = append(others, m)
		}
	}
	return throttled, plain, tooMany, others
}

func agentSign(ctx context.Context, client securityapi.IstioCertificateServiceClient, r request, res *agentResult) signOutcome {
	var err error
	for attempt := 1; attempt <= agentAttempts; attempt++ {
		if attempt > 1 {
			d := min(agentBackoffBase<<(attempt-2), agentBackoffMax)
			d -= time.Duration(rand.Float64() * 0.2 * float64(d))
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return signOutcome{err: ctx.Err()}
			}
		}
		res.mu.Lock()
		res.attempts++
		res.mu.Unlock()
		// A guard against a hang only: the CA bounds each review itself.
		actx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.token), 2*time.Minute)
		var resp *securityapi.IstioCertificateResponse
		resp, err = client.CreateCertificate(actx, &securityapi.IstioCertificateRequest{
			Csr: r.csr, ValidityDuration: int64(time.Hour / time.Second),
		})
		cancel()
		if err == nil && len(resp.GetCertChain()) > 1 {
			return signOutcome{attempt: attempt}
		}
		if err == nil {
			err = fmt.Errorf("a chain of %d elements", len(resp.GetCertChain()))
		}
		res.failed(err)
		if c := status.Code(err); c != codes.Unavailable && c != codes.ResourceExhausted {
			return signOutcome{err: err} // an agent would not retry it either
		}
	}
	return signOutcome{err: err}
}

// sum is m.Sum, failing the test on a sample it cannot read.
func sum(t *testing.T, m harness.APIMetrics, metric string, labels ...string) float64 {
	t.Helper()
	v, err := m.Sum(metric, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func httpStatus(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
