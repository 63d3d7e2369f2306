// Package kubeclient is the CA's Kubernetes client: typed clients for the
// few API groups meshid uses (core/v1, authentication/v1 TokenReview,
// coordination/v1 Lease, certificates/v1 PodCertificateRequest and
// ClusterTrustBundle) and shared informers over them, built on
// client-go's rest, gentype, tools/cache and listers packages.
//
// Why not client-go's kubernetes.Clientset: its typed clients all import
// k8s.io/client-go/kubernetes/scheme, which registers every one of the 56
// API groups of k8s.io/api, and kubernetes.Interface keeps every group's
// client (with client-go's apply configurations and discovery) reachable.
// Moving the CA off it roughly halved the meshid binary and its image
// (the measured sizes: docs/benchmarks.md, "Kubernetes client narrowed"),
// for six resources. Here the scheme holds
// only the groups above, and the typed clients are client-go's own
// generic ones (gentype), so the requests, protobuf negotiation, rate
// limiting and watch handling are client-go's.
//
// Interface has the method sets of kubernetes.Interface for the resources
// it has, less Apply and the resource-specific extras (pod logs, eviction,
// token requests): CoreV1().Secrets(ns).Get(...) reads the same, so code
// moves from one to the other by changing the type. Informers come from an
// InformerFactory shaped like client-go's SharedInformerFactory; its
// listers are client-go's listers/core/v1. The fake sub-package is the
// kubernetes/fake equivalent for unit tests (client-go's object tracker,
// reactors and recorded actions); test/kube/e2e's kubeclient_test.go runs
// the real one against a real API server.
//
// Keep k8s.io/client-go/kubernetes, .../informers, .../tools/leaderelection
// and .../metadata/metadatainformer out of production packages: any one of
// them brings every API group back (TestNarrowScheme in this package
// checks cmd/meshid's dependencies; test/image bounds the image).
package kubeclient
