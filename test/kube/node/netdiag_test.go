package node_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// netDiag is the node's network counters, for a failed handshake: the
// per-CPU packet backlog drops (/proc/net/softnet_stat's second column),
// conntrack's statistics (insert_failed, drop), the packets kube-proxy
// dropped as conntrack-INVALID, and the end of kube-proxy's log.
func netDiag() string {
	var b strings.Builder
	if s, err := os.ReadFile("/proc/net/softnet_stat"); err == nil {
		fmt.Fprintf(&b, "softnet_stat:\n%s", s)
	}
	for _, cmd := range [][]string{{"conntrack", "-S"}, {"iptables", "-L", "KUBE-FORWARD", "-v", "-n", "-x"}, {"nstat", "-az", "TcpExtListenDrops", "TcpExtTCPSynRetrans", "IpExtInNoRoutes"}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s (%v)\n%s", strings.Join(cmd, " "), err, out)
	}
	return b.String()
}
