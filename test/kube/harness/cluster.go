package harness

import (
	"context"
	"crypto"
	"crypto/rsa"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/kubeclient"
)

// DefaultIssuer is the --service-account-issuer of the test cluster, the
// same as a kubeadm cluster's.
const DefaultIssuer = "https://kubernetes.default.svc.cluster.local"

// StaticToken is a user of --token-auth-file: a bearer token that
// authenticates a user who is not a service account.
type StaticToken struct {
	Token  string
	User   string
	UID    string
	Groups []string
}

// Config describes the cluster to run.
type Config struct {
	// BinDir holds the etcd and kube-apiserver binaries; empty means the
	// directory EnsureBinaries returns.
	BinDir string
	// Dir is where data, certificates and logs go; empty means a new
	// temporary directory, removed by Stop.
	Dir string
	// Issuer is --service-account-issuer; empty means DefaultIssuer.
	Issuer string
	// APIAudiences are added to --api-audiences (the issuer is always one).
	// Audience-agnostic authenticators such as --token-auth-file only
	// authenticate a TokenReview whose audiences intersect these.
	APIAudiences []string
	// ServiceAccountKeyType is the key the API server signs
	// service-account tokens with: KeyECP256 (ES256, the default) or
	// KeyRSA2048 (RS256, what kubeadm and the managed clusters use).
	ServiceAccountKeyType string
	// StaticTokens become --token-auth-file.
	StaticTokens []StaticToken
	// NodeAuthorization runs the API server with the Node authorizer
	// before RBAC and the NodeRestriction admission plugin, so that the
	// clients of NodeConfig are judged as kubelets.
	NodeAuthorization bool
	// ServiceAccountAdmission keeps the ServiceAccount admission plugin on:
	// pods get the default service account and its API token volume. Off
	// by default, because it refuses every pod whose service account does
	// not exist and no controller-manager creates them; the node suite
	// runs one.
	ServiceAccountAdmission bool
	// ExtraArgs are appended to the kube-apiserver command line.
	ExtraArgs []string
	// StartTimeout bounds each wait for readiness; 0 means 2 minutes.
	StartTimeout time.Duration
	Logger       *slog.Logger
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	cfg        Config
	dir        string
	removeDir  bool
	pki        *pki
	etcd       *Process
	apiserver  *Process
	host       string // https://127.0.0.1:<port>
	etcdURL    string // http://127.0.0.1:<port>
	admin      *rest.Config
	client     kubernetes.Interface
	meshClient kubeclient.Interface
	kubeconfig string
	log        *slog.Logger
}

// New validates cfg, creates the directories and generates every key and
// certificate. It starts nothing; call Start.
func New(cfg Config) (*Cluster, error) {
	if cfg.Issuer == "" {
		cfg.Issuer = DefaultIssuer
	}
	if cfg.ServiceAccountKeyType == "" {
		cfg.ServiceAccountKeyType = KeyECP256
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.BinDir == "" {
		dir, err := BinDir()
		if err != nil {
			return nil, err
		}
		cfg.BinDir = dir
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("harness: %s missing in %s (run test/kube/hack/build-binaries.sh): %w", b, cfg.BinDir, err)
		}
	}
	for _, st := range cfg.StaticTokens {
		if st.Token == "" || st.User == "" || st.UID == "" {
			return nil, errors.New("harness: a static token needs Token, User and UID")
		}
	}
	c := &Cluster{cfg: cfg, dir: cfg.Dir, log: cfg.Logger}
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "meshid-kube-")
		if err != nil {
			return nil, fmt.Errorf("harness: %w", err)
		}
		c.dir, c.removeDir = dir, true
	}
	p, err := newPKI(time.Now(), cfg.ServiceAccountKeyType)
	if err != nil {
		return nil, err
	}
	c.pki = p
	if err := c.writeFiles(); err != nil {
		return nil, err
	}
	if err := c.configureProcesses(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) writeFiles() error {
	saKey, err := encodeKey(c.pki.saKey)
	if err != nil {
		return err
	}
	saPub, err := encodePublicKey(c.pki.saKey.Public())
	if err != nil {
		return err
	}
	var tokens strings.Builder
	w := csv.NewWriter(&tokens)
	for _, st := range c.cfg.StaticTokens {
		if err := w.Write([]string{st.Token, st.User, st.UID, strings.Join(st.Groups, ",")}); err != nil {
			return fmt.Errorf("harness: token file: %w", err)
		}
	}
	w.Flush()
	files := map[string][]byte{
		"ca.crt":         encodeCert(c.pki.caCert),
		"serving.crt":    c.pki.servingPEM,
		"serving.key":    c.pki.servingKey,
		"sa.key":         saKey,
		"sa.pub":         saPub,
		"tokens.csv":     []byte(tokens.String()),
		"etcd/.keep":     nil,
		"cert-dir/.keep": nil,
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(c.path(name)), 0o700); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		if err := os.WriteFile(c.path(name), data, 0o600); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	return nil
}

func (c *Cluster) configureProcesses() error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.host = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	c.etcdURL = etcdClient
	c.etcd = &Process{
		name:    "etcd",
		path:    filepath.Join(c.cfg.BinDir, "etcd"),
		logPath: c.path("etcd.log"),
		args: []string{
			"--name=harness",
			"--data-dir=" + c.path("etcd/data"),
			"--listen-client-urls=" + etcdClient,
			"--advertise-client-urls=" + etcdClient,
			"--listen-peer-urls=" + etcdPeer,
			"--initial-advertise-peer-urls=" + etcdPeer,
			"--initial-cluster=harness=" + etcdPeer,
			"--log-level=warn",
			// Test data is disposable: skip fsync, which dominates etcd's
			// latency on a shared CI disk.
			"--unsafe-no-fsync",
		},
	}
	audiences := append([]string{c.cfg.Issuer}, c.cfg.APIAudiences...)
	args := []string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + c.path("cert-dir"),
		"--tls-cert-file=" + c.path("serving.crt"),
		"--tls-private-key-file=" + c.path("serving.key"),
		"--client-ca-file=" + c.path("ca.crt"),
		"--service-cluster-ip-range=10.96.0.0/16",
		serviceAccountAdmissionArg(c.cfg),
		"--service-account-key-file=" + c.path("sa.pub"),
		"--service-account-signing-key-file=" + c.path("sa.key"),
		"--service-account-issuer=" + c.cfg.Issuer,
		"--api-audiences=" + strings.Join(audiences, ","),
		"--token-auth-file=" + c.path("tokens.csv"),
		// No nodes, no kube-proxy: nothing may try to reach the
		// "kubernetes" Service endpoints, and loopback is not a valid
		// endpoint address.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--shutdown-delay-duration=0s",
		"--v=1",
	}
	c.apiserver = &Process{
		name:    "kube-apiserver",
		path:    filepath.Join(c.cfg.BinDir, "kube-apiserver"),
		logPath: c.path("kube-apiserver.log"),
		args:    slices.Concat(args, authorizationArgs(c.cfg), c.cfg.ExtraArgs),
	}
	c.admin = &rest.Config{
		Host: c.host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   encodeCert(c.pki.caCert),
			CertData: c.pki.adminCert,
			KeyData:  c.pki.adminKey,
		},
		QPS:   200,
		Burst: 400,
	}
	client, err := kubernetes.NewForConfig(c.admin)
	if err != nil {
		return fmt.Errorf("harness: admin client: %w", err)
	}
	c.client = client
	if c.meshClient, err = kubeclient.New(c.admin); err != nil {
		return fmt.Errorf("harness: admin kubeclient: %w", err)
	}
	c.kubeconfig = c.path("admin.kubeconfig")
	return c.writeKubeconfig(c.kubeconfig, c.pki.adminCert, c.pki.adminKey, "")
}

// Start starts etcd and the API server and waits until /readyz is ok.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.etcd.start(); err != nil {
		return err
	}
	if err := c.waitFor(ctx, c.etcd, c.etcdHealthy); err != nil {
		return fmt.Errorf("%w\netcd log:\n%s", err, c.etcd.Tail(4096))
	}
	return c.StartAPIServer(ctx)
}

// Boot finds or builds the binaries (EnsureBinaries), then creates and
// starts a cluster with cfg, its BinDir set to them: what a TestMain does
// first. The caller stops the cluster; one that fails to start is stopped.
func Boot(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := EnsureBinaries()
	if err != nil {
		return nil, err
	}
	cfg.BinDir = bin
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// StartAPIServer (re)starts the API server on the same port and waits
// until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if err := c.apiserver.start(); err != nil {
		return err
	}
	if err := c.waitFor(ctx, c.apiserver, c.apiserverReady); err != nil {
		return fmt.Errorf("%w\nkube-apiserver log:\n%s", err, c.apiserver.Tail(8192))
	}
	c.log.Info("kube-apiserver ready", "host", c.host)
	return nil
}

// StopAPIServer stops the API server and waits until it has exited; etcd
// keeps running, so StartAPIServer brings the same cluster back.
func (c *Cluster) StopAPIServer() error {
	return c.apiserver.Stop(30 * time.Second)
}

// Stop stops both processes and removes the temporary directory. It is
// safe to call more than once.
func (c *Cluster) Stop() error {
	err := errors.Join(c.apiserver.Stop(30*time.Second), c.etcd.Stop(10*time.Second))
	if c.removeDir {
		err = errors.Join(err, os.RemoveAll(c.dir))
	}
	return err
}

// APIServerLog returns the end of the API server's log, for failure output.
func (c *Cluster) APIServerLog() string { return c.apiserver.Tail(8192) }

func (c *Cluster) waitFor(ctx context.Context, p *Process, ready func(context.Context) bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	exited := p.Exited()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("harness: %s exited during start", p.name)
		default:
		}
		return ready(ctx), nil
	})
	if err != nil {
		return fmt.Errorf("harness: waiting for %s: %w", p.name, err)
	}
	return nil
}

func (c *Cluster) etcdHealthy(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`)
}

func (c *Cluster) apiserverReady(ctx context.Context) bool {
	res := c.client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx)
	var code int
	res.StatusCode(&code)
	return res.Error() == nil && code == http.StatusOK
}

// Host is the API server URL, https://127.0.0.1:<port>.
func (c *Cluster) Host() string { return c.host }

// Dir is the cluster's working directory (logs, kubeconfigs).
func (c *Cluster) Dir() string { return c.dir }

// AdminConfig returns a copy of the admin (system:masters) client config.
func (c *Cluster) AdminConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Client is an admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// MeshClient is an admin client of the type meshid's components take
// (ca/kubeclient: the CA's narrow clientset), for their Configs.
func (c *Cluster) MeshClient() kubeclient.Interface { return c.meshClient }

// AdminKubeconfig is the path of a kubeconfig file for the admin user.
func (c *Cluster) AdminKubeconfig() string { return c.kubeconfig }

// CACertPEM is the CA of the API server's serving certificate (and of
// client certificates).
func (c *Cluster) CACertPEM() []byte { return encodeCert(c.pki.caCert) }

// Issuer is the service-account token issuer.
func (c *Cluster) Issuer() string { return c.cfg.Issuer }

// ServiceAccountKey is the key the API server signs service-account tokens
// with (Config.ServiceAccountKeyType); tests use it to make tokens the API
// server must reject (expired).
func (c *Cluster) ServiceAccountKey() crypto.Signer { return c.pki.saKey }

// ServiceAccountAlgorithm is the JWS algorithm of the API server's
// service-account tokens: ES256 or RS256.
func (c *Cluster) ServiceAccountAlgorithm() jose.SignatureAlgorithm {
	if _, ok := c.pki.saKey.(*rsa.PrivateKey); ok {
		return jose.RS256
	}
	return jose.ES256
}

// Ports for child processes are chosen at random in [portLow, portHigh):
// below the kernel's ephemeral range (32768 and up by default) and the
// NodePort range (30000-32767). A port the kernel picks for ":0" is an
// ephemeral one, which any process's next outgoing connection (a client of
// the API server, say) may take as its source port before the child binds
// it: TestKubeCAActivateOnFollower failed in CI with "bind: address already
// in use" that way.
const (
	portLow  = 20000
	portHigh = 30000
)

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("harness: no free port in [%d, %d) after %d tries", portLow, portHigh, tries)
		}
		port := portLow + rand.IntN(portHigh-portLow)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken: try another
		}
		ls = append(ls, l)
		ports = append(ports, port)
	}
	return ports, nil
}

// FreeAddr returns "127.0.0.1:<port>" with a port that was free a moment
// ago, for a child process that needs its address on the command line.
func FreeAddr() (string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
}

// APIServerRunning reports whether the API server process is running.
func (c *Cluster) APIServerRunning() bool { return c.apiserver.Running() }

// APIServerCPU is the CPU time the API server process has used so far.
func (c *Cluster) APIServerCPU() (time.Duration, error) { return c.apiserver.CPUTime() }

// APIServerRequests sums the API server's own apiserver_request_total
// samples for resource (all verbs and codes), read from its /metrics.
func (c *Cluster) APIServerRequests(ctx context.Context, resource string) (float64, error) {
	m, err := c.APIServerMetrics(ctx)
	if err != nil {
		return 0, err
	}
	return m.Sum("apiserver_request_total", `resource="`+resource+`"`)
}

// APIMetrics is one read of the API server's /metrics, a sample a line.
type APIMetrics []string

// APIServerMetrics reads the API server's /metrics.
func (c *Cluster) APIServerMetrics(ctx context.Context) (APIMetrics, error) {
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("harness: /metrics: %w", err)
	}
	return strings.Split(string(raw), "\n"), nil
}

// Sum adds up the samples of metric whose labels include every one of
// labels (each `name="value"`).
func (m APIMetrics) Sum(metric string, labels ...string) (float64, error) {
	sum := 0.0
	for _, line := range m {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		if !slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(rest, l) }) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				return 0, fmt.Errorf("harness: /metrics: %q: %w", line, err)
			}
			sum += v
		}
	}
	return sum, nil
}
