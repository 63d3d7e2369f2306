package freshtokens

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Defaults of Config.
const (
	DefaultNamespace      = "meshid-bench"
	DefaultServiceAccount = "bench"
	DefaultNode           = "meshid-bench-node"
	DefaultAudience       = "istio-ca"
	DefaultTokenTTL       = time.Hour
	DefaultParallel       = 16
)

// Config configures New.
type Config struct {
	// Client creates the pods and tokens and reads /metrics. Required.
	Client kubernetes.Interface
	// Count is the number of pods and tokens. Required, at least 1.
	Count int
	// Namespace, ServiceAccount and Node of the pods; Audience and
	// TokenTTL of their tokens; Parallel API calls at once.
	Namespace, ServiceAccount, Node, Audience string
	TokenTTL                                  time.Duration
	Parallel                                  int
}

// Fleet mints fresh pod-bound tokens.
type Fleet struct {
	cfg  Config
	pods []string
}

// New validates cfg and applies its defaults. It makes no request.
func New(cfg Config) (*Fleet, error) {
	if cfg.Client == nil {
		return nil, errors.New("freshtokens: Config.Client is required")
	}
	if cfg.Count < 1 {
		return nil, fmt.Errorf("freshtokens: count %d: want at least 1", cfg.Count)
	}
	cfg.Namespace = cmp.Or(cfg.Namespace, DefaultNamespace)
	cfg.ServiceAccount = cmp.Or(cfg.ServiceAccount, DefaultServiceAccount)
	cfg.Node = cmp.Or(cfg.Node, DefaultNode)
	cfg.Audience = cmp.Or(cfg.Audience, DefaultAudience)
	cfg.TokenTTL = cmp.Or(cfg.TokenTTL, DefaultTokenTTL)
	cfg.Parallel = cmp.Or(cfg.Parallel, DefaultParallel)
	if cfg.TokenTTL < 10*time.Minute {
		return nil, fmt.Errorf("freshtokens: token TTL %s is under the API server's 10m minimum", cfg.TokenTTL)
	}
	return &Fleet{cfg: cfg}, nil
}

// Mint creates the namespace and service account (if needed), then the
// pods, and returns one token bound to each pod. Pods of an earlier run
// are replaced first, so every token is fresh.
func (f *Fleet) Mint(ctx context.Context) ([]string, error) {
	c, cfg := f.cfg.Client, f.cfg
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("freshtokens: namespace %s: %w", cfg.Namespace, err)
	}
	_, err = c.CoreV1().ServiceAccounts(cfg.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: cfg.ServiceAccount}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("freshtokens: service account %s/%s: %w", cfg.Namespace, cfg.ServiceAccount, err)
	}
	if err := f.Cleanup(ctx); err != nil {
		return nil, err
	}
	tokens := make([]string, cfg.Count)
	f.pods = make([]string, cfg.Count)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.Parallel)
	for i := range tokens {
		g.Go(func() error {
			tok, pod, err := f.mintOne(gctx, i)
			tokens[i], f.pods[i] = tok, pod
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return tokens, nil
}

func (f *Fleet) mintOne(ctx context.Context, i int) (token, pod string, err error) {
	cfg := f.cfg
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fresh-%d", i), Namespace: cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/created-by": "meshid-bench"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: cfg.ServiceAccount,
			NodeName:           cfg.Node,
			Containers:         []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	p, err = f.cfg.Client.CoreV1().Pods(cfg.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("freshtokens: pod %d: %w", i, err)
	}
	secs := int64(cfg.TokenTTL / time.Second)
	tr, err := f.cfg.Client.CoreV1().ServiceAccounts(cfg.Namespace).CreateToken(ctx, cfg.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{cfg.Audience},
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", p.Name, fmt.Errorf("freshtokens: token for pod %s: %w", p.Name, err)
	}
	return tr.Status.Token, p.Name, nil
}

// Cleanup deletes the bench's pods (at once: no kubelet runs them).
func (f *Fleet) Cleanup(ctx context.Context) error {
	zero := int64(0)
	err := f.cfg.Client.CoreV1().Pods(f.cfg.Namespace).DeleteCollection(ctx,
		metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/created-by=meshid-bench"})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("freshtokens: delete the bench's pods: %w", err)
	}
	return nil
}

// Namespace and ServiceAccount are the identity of the tokens.
func (f *Fleet) Namespace() string      { return f.cfg.Namespace }
func (f *Fleet) ServiceAccount() string { return f.cfg.ServiceAccount }

// Requests reads the API server's apiserver_request_total and sums it by
// resource ("" for non-resource URLs), all verbs and codes.
func Requests(ctx context.Context, c kubernetes.Interface) (map[string]float64, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("freshtokens: the API server's /metrics: %w", err)
	}
	return parseRequests(raw)
}

// parseRequests sums apiserver_request_total samples of a Prometheus text
// page by their resource label.
func parseRequests(page []byte) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("freshtokens: malformed sample %q", line)
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("freshtokens: sample %q: %w", line, err)
		}
		res := ""
		if _, after, ok := strings.Cut(labels, `resource="`); ok {
			res, _, _ = strings.Cut(after, `"`)
		}
		out[res] += v
	}
	return out, sc.Err()
}

// Delta is after minus before, by resource, without the zeros.
func Delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
