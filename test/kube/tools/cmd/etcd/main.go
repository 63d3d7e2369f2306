// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3/etcdmain),
// built from the module proxy at the version k8s.io/kubernetes resolves, so the
// test harness needs no prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
