package sdsserver_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshid/meshid/sds/sdsserver"
)

// The load client: when this test binary is started with loadClientEnv
// set, it opens SDS streams instead of running tests (see
// BenchmarkRotationFanout10k).
const loadClientEnv = "MESHID_SDS_LOAD_CLIENT" // "<socket> <streams> <conns>"

func TestMain(m *testing.M) {
	if spec := os.Getenv(loadClientEnv); spec != "" {
		os.Exit(loadClient(spec, os.Stdin, os.Stdout))
	}
	verifyNoLeaks(m)
}

// loadClient opens the streams, prints "ready" once each holds default,
// and for every "expect <version>" line on in prints "done" once every
// stream holds that version.
func loadClient(spec string, in io.Reader, out io.Writer) int {
	var path string
	var streams, conns int
	if _, err := fmt.Sscan(spec, &path, &streams, &conns); err != nil {
		fmt.Fprintln(os.Stderr, "load client:", err)
		return 2
	}
	clients := make([]secretv3.SecretDiscoveryServiceClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "load client:", err)
			return 1
		}
		clients[i] = secretv3.NewSecretDiscoveryServiceClient(conn)
	}
	var (
		target  atomic.Pointer[string]
		gen     atomic.Int64
		count   atomic.Int64
		outMu   sync.Mutex
		ready   sync.WaitGroup
		latest  = make([]atomic.Pointer[string], streams)
		counted = make([]atomic.Int64, streams)
	)
	empty := ""
	target.Store(&empty)
	say := func(s string) {
		outMu.Lock()
		fmt.Fprintln(out, s)
		outMu.Unlock()
	}
	// tally counts stream i once per expectation when it holds the target.
	tally := func(i int) {
		g := gen.Load()
		v := latest[i].Load()
		if v != nil && *v == *target.Load() && counted[i].Swap(g) != g {
			if count.Add(1) == int64(streams) {
				say("done")
			}
		}
	}
	ready.Add(streams)
	for i := range streams {
		go func() {
			s, err := clients[i%conns].StreamSecrets(context.Background())
			if err != nil {
				fmt.Fprintln(os.Stderr, "load client:", err)
				os.Exit(1)
			}
			req := &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{"default"}}
			if err := s.Send(req); err != nil {
				fmt.Fprintln(os.Stderr, "load client:", err)
				os.Exit(1)
			}
			first := true
			for {
				r, err := s.Recv()
				if err != nil {
					if first {
						fmt.Fprintln(os.Stderr, "load client:", err)
						os.Exit(1)
					}
					return
				}
				v := r.GetVersionInfo()
				latest[i].Store(&v)
				ack := &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{"default"}, VersionInfo: v, ResponseNonce: r.GetNonce()}
				if err := s.Send(ack); err != nil {
					return
				}
				if first {
					first = false
					ready.Done()
				}
				tally(i)
			}
		}()
	}
	ready.Wait()
	say("ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "expect ")
		if !ok {
			continue
		}
		count.Store(0)
		target.Store(&v)
		gen.Add(1)
		for i := range streams {
			tally(i)
		}
	}
	return 0
}

// loadClientProc is the parent's handle on a load client process.
type loadClientProc struct {
	tb  testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startLoadClient(tb testing.TB, path string, streams, conns int) *loadClientProc {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), loadClientEnv+"="+path+" "+strconv.Itoa(streams)+" "+strconv.Itoa(conns))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &loadClientProc{tb: tb, cmd: cmd, in: in, out: bufio.NewScanner(out)}
}

// close kills the client process (all its streams end at once) and waits
// for it.
func (l *loadClientProc) close() {
	l.in.Close()
	_ = l.cmd.Process.Kill()
	_ = l.cmd.Wait()
}

func (l *loadClientProc) send(line string) {
	if _, err := fmt.Fprintln(l.in, line); err != nil {
		l.tb.Fatal(err)
	}
}

// wait reads lines until want; the client exiting fails the benchmark.
func (l *loadClientProc) wait(want string) {
	for l.out.Scan() {
		if l.out.Text() == want {
			return
		}
	}
	l.tb.Fatalf("load client ended before %q: %v", want, l.out.Err())
}
