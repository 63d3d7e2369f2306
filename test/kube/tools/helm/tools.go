//go:build tools

// Package helm pins the Helm CLI that test/kube runs (helm lint, template,
// install, upgrade, uninstall against the harness's real API server).
// hack/build-helm.sh builds helm.sh/helm/v4/cmd/helm from this module, at
// exactly the version below, into the per-user cache beside kube-apiserver.
package helm

import _ "helm.sh/helm/v4/cmd/helm"
