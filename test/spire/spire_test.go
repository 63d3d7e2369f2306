package spire_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meshid/meshid/internal/testkit"
)

// slow bounds the waits on SPIRE's processes: a start on a loaded machine
// (SQLite migrations, the first CA and SVIDs) and a SPIRE agent's sync
// (every 5 s) take longer than testkit.Guard allows in-process components.
const slow = 2 * time.Minute

// binDir is where scripts/build-spire.sh put spire-server and spire-agent
// ($SPIRE_BIN_DIR, as for the script; else the per-user cache). The test
// fails, saying how to build them, when they are missing: it never skips.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SPIRE_BIN_DIR")
	if dir == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Fatal(err)
			}
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "meshid", "spire-bin")
	}
	for _, b := range []string{"spire-server", "spire-agent"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%v: build SPIRE first with `make spire-binary` (bash scripts/build-spire.sh)", err)
		}
	}
	return dir
}

// freePort reserves a loopback port for a SPIRE listener.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// spireServer is a running spire-server of trust domain td.
type spireServer struct {
	bin, dir, sock string
	td             string
	port           int // the agents' API
	bundlePort     int // the bundle endpoint (https_spiffe)
}

// spireServerConf is spire-server's configuration: SQLite, keys in memory,
// join-token node attestation, its bundle endpoint on loopback, and
// federation with peerTD's bundle endpoint (https_spiffe, endpoint ID
// peerID), as docs/federation.md shows.
const spireServerConf = `server {
  bind_address = "127.0.0.1"
  bind_port = "%d"
  socket_path = %q
  trust_domain = %q
  data_dir = %q
  log_level = "DEBUG"
  ca_ttl = "24h"
  default_x509_svid_ttl = "1h"
  federation {
    bundle_endpoint {
      address = "127.0.0.1"
      port = %d
    }
    federates_with %q {
      bundle_endpoint_url = %q
      bundle_endpoint_profile "https_spiffe" {
        endpoint_spiffe_id = %q
      }
    }
  }
}
plugins {
  DataStore "sql" {
    plugin_data {
      database_type = "sqlite3"
      connection_string = %q
    }
  }
  KeyManager "memory" {
    plugin_data {}
  }
  NodeAttestor "join_token" {
    plugin_data {}
  }
}
`

// startSPIREServer runs spire-server for td, federating with peerTD at
// peerURL (endpoint ID peerID), until the test ends; it returns once the
// server's API answers.
func startSPIREServer(t *testing.T, bin, td, peerTD, peerURL, peerID string) *spireServer {
	t.Helper()
	s := &spireServer{bin: bin, dir: t.TempDir(), sock: filepath.Join(testkit.ShortDir(t), "api.sock"), td: td,
		port: freePort(t), bundlePort: freePort(t)}
	conf := filepath.Join(s.dir, "server.conf")
	data := filepath.Join(s.dir, "data")
	body := fmt.Sprintf(spireServerConf, s.port, s.sock, td, data, s.bundlePort, peerTD, peerURL, peerID, filepath.Join(data, "datastore.sqlite3"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "spire-server", filepath.Join(bin, "spire-server"), s.dir, "run", "-config", conf)
	waitServing(t, s.sock, "spire-server")
	return s
}

// cli runs a spire-server command against s's API socket and returns its
// standard output.
func (s *spireServer) cli(t *testing.T, args ...string) string {
	t.Helper()
	args = append(args, "-socketPath", s.sock)
	ctx, cancel := context.WithTimeout(context.Background(), slow)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "spire-server"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("spire-server %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// spireAgentConf: join-token node attestation, keys in memory, the unix
// workload attestor.
const spireAgentConf = `agent {
  data_dir = %q
  log_level = "DEBUG"
  server_address = "127.0.0.1"
  server_port = "%d"
  socket_path = %q
  trust_bundle_path = %q
  trust_domain = %q
}
plugins {
  NodeAttestor "join_token" {
    plugin_data {}
  }
  KeyManager "memory" {
    plugin_data {}
  }
  WorkloadAttestor "unix" {
    plugin_data {}
  }
}
`

// startSPIREAgent runs spire-agent against s with a join token for
// nodeID; it returns the agent's Workload API socket once it answers.
func startSPIREAgent(t *testing.T, s *spireServer, nodeID string) string {
	t.Helper()
	out := s.cli(t, "token", "generate", "-spiffeID", nodeID, "-ttl", "600")
	token, ok := strings.CutPrefix(strings.TrimSpace(out), "Token: ")
	if !ok || strings.ContainsAny(token, " \n") {
		t.Fatalf("spire-server token generate printed %q", out)
	}
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle.pem") // the bootstrap bundle, as an operator hands it over
	if err := os.WriteFile(bundle, []byte(s.cli(t, "bundle", "show", "-format", "pem")), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testkit.ShortDir(t), "agent.sock")
	conf := filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, spireAgentConf, filepath.Join(dir, "data"), s.port, sock, bundle, s.td), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "spire-agent", filepath.Join(s.bin, "spire-agent"), dir, "run", "-config", conf, "-joinToken", token)
	waitServing(t, sock, "spire-agent")
	return sock
}

// start runs a SPIRE binary in dir, its output in dir/<name>.log (printed
// when the test fails), until the test ends: then SIGTERM, and SIGKILL
// after slow.
func start(t *testing.T, name, bin, dir string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); logFile.Close() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(slow):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s's log (pid %s):\n%s", name, strconv.Itoa(cmd.Process.Pid), b)
			}
		}
	})
}

// waitServing waits until the gRPC server on sock answers (SPIRE's server
// and agent serve the standard health service there; any answer, even
// NOT_SERVING or Unimplemented, means the socket is up).
func waitServing(t *testing.T, sock, name string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), slow)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); ctx.Err() != nil {
		t.Fatalf("%s: its socket %s did not answer within %v (%v)", name, sock, slow, err)
	}
}
