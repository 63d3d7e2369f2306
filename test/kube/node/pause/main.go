// Command pause is the node suite's sandbox image: it holds a pod's
// namespaces by sleeping until it is told to stop, as registry.k8s.io/pause
// does, and is built static so that its image needs nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
}
