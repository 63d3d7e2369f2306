package podagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/meshid/meshid/ca/kubeclient"
)

// Defaults of Config.
const (
	DefaultContainer = "meshid-agent"
	DefaultPort      = 15020 // the port of the agent's default --monitoring-listen
	DefaultTimeout   = 15 * time.Second
	DefaultMaxBody   = 4 << 20
)

// Config names a pod's agent and how to reach it.
type Config struct {
	REST      *rest.Config // required
	Namespace string       // required
	Pod       string       // required
	Container string       // default DefaultContainer
	Timeout   time.Duration
	MaxBody   int64 // bytes read from the answer at most
}

// Agent is a pod's agent, reachable through the API server.
type Agent struct {
	cfg    Config
	client kubeclient.Interface
}

// New validates cfg.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.REST == nil:
		return nil, errors.New("podagent: no Kubernetes client configuration")
	case cfg.Namespace == "" || cfg.Pod == "":
		return nil, errors.New("podagent: namespace and pod name are required")
	}
	if cfg.Container == "" {
		cfg.Container = DefaultContainer
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	client, err := kubeclient.New(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("podagent: %v", err)
	}
	return &Agent{cfg: cfg, client: client}, nil
}

// Port looks the pod up and returns the agent's monitoring port.
func (a *Agent) Port(ctx context.Context) (int, error) {
	pod, err := a.client.CoreV1().Pods(a.cfg.Namespace).Get(ctx, a.cfg.Pod, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s: %v", a.cfg.Namespace, a.cfg.Pod, err)
	}
	return MonitoringPort(pod, a.cfg.Container)
}

// Get makes one GET of path to the agent's monitoring port through a
// port-forward and returns the body of a 200 answer.
func (a *Agent) Get(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	port, err := a.Port(ctx)
	if err != nil {
		return nil, err
	}
	local, stop, err := a.forward(ctx, port)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: port-forward to %d: %v", a.cfg.Namespace, a.cfg.Pod, port, err)
	}
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+local+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: GET %s on port %d: %v", a.cfg.Namespace, a.cfg.Pod, path, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, a.cfg.MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: GET %s: %v", a.cfg.Namespace, a.cfg.Pod, path, err)
	}
	if int64(len(body)) > a.cfg.MaxBody {
		return nil, fmt.Errorf("pod %s/%s: GET %s: answer larger than %d bytes", a.cfg.Namespace, a.cfg.Pod, path, a.cfg.MaxBody)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return nil, fmt.Errorf("pod %s/%s: GET %s on port %d: %s: %.200s", a.cfg.Namespace, a.cfg.Pod, path, port, resp.Status, msg)
	}
	return body, nil
}

// forward starts a port-forward from a free local port to the pod's port
// (WebSocket first, SPDY when the API server is older, as kubectl does).
func (a *Agent) forward(ctx context.Context, port int) (local string, stop func(), err error) {
	url := a.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(a.cfg.Namespace).Name(a.cfg.Pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(a.cfg.REST)
	if err != nil {
		return "", nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	if ws, err := portforward.NewSPDYOverWebsocketDialer(url, a.cfg.REST); err == nil {
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	fctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddressesWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, ready, io.Discard, io.Discard)
	if err != nil {
		cancel()
		return "", nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		cancel()
		if err == nil {
			err = errors.New("port-forward ended")
		}
		return "", nil, err
	case <-ctx.Done():
		cancel()
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		cancel()
		return "", nil, fmt.Errorf("no local port: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), func() { cancel(); <-errc }, nil
}

// MonitoringPort is the port of the agent container's --monitoring-listen
// (an argument of its command or args), else DefaultPort. The container
// may be a native sidecar (an init container).
func MonitoringPort(pod *corev1.Pod, container string) (int, error) {
	var names []string
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != container {
			names = append(names, c.Name)
			continue
		}
		listen, ok := flagValue(append(append([]string(nil), c.Command...), c.Args...), "--monitoring-listen")
		if !ok {
			return DefaultPort, nil
		}
		if listen == "" {
			return 0, fmt.Errorf("pod %s/%s: container %q runs with --monitoring-listen= (monitoring off): nothing to reach", pod.Namespace, pod.Name, container)
		}
		_, p, err := net.SplitHostPort(listen)
		n, perr := strconv.Atoi(p)
		if err != nil || perr != nil || n <= 0 || n > 65535 {
			return 0, fmt.Errorf("pod %s/%s: container %q: --monitoring-listen %q is not HOST:PORT", pod.Namespace, pod.Name, container, listen)
		}
		return n, nil
	}
	return 0, fmt.Errorf("pod %s/%s has no container %q (it has: %s); name the agent's with --container", pod.Namespace, pod.Name, container, strings.Join(names, ", "))
}

// flagValue finds --name=value or --name value (the last one wins, as in
// pflag).
func flagValue(args []string, name string) (string, bool) {
	v, found := "", false
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, name+"="):
			v, found = strings.TrimPrefix(a, name+"="), true
		case a == name && i+1 < len(args):
			v, found = args[i+1], true
		}
	}
	return v, found
}

// ParseRef splits a pod named NAMESPACE/NAME (meshid inspect --pod).
func ParseRef(ref string) (namespace, name string, err error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want NAMESPACE/NAME", ref)
	}
	return ns, name, nil
}

// LoadREST is the client configuration kubectl would use: the kubeconfig
// file, else client-go's default loading rules ($KUBECONFIG, then
// ~/.kube/config).
func LoadREST(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}
