{{/* The objects' base name: fullnameOverride, else the release name if it
contains "meshid", else "<release>-meshid". */}}
{{- define "meshid.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "meshid" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-meshid" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "meshid.labels" -}}
app.kubernetes.io/name: meshid
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "meshid.selectorLabels" -}}
app.kubernetes.io/name: meshid
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ca
{{- end -}}

{{/* The server's arguments, a YAML list. A value under .Values.server that is
unset ("", null or an empty list) leaves its flag out, so the server's own
default applies; lists are joined with commas; whole numbers are printed
as integers (YAML numbers are floats, and 1e+06 is no --max-connections). */}}
{{- define "meshid.args" -}}
{{- $s := .Values.server -}}
{{- $fullname := include "meshid.fullname" . -}}
{{- $dns := concat (list (printf "%s.%s.svc" $fullname .Release.Namespace) (printf "%s.%s.svc.cluster.local" $fullname .Release.Namespace)) ($s.servingDNSNames | default list) -}}
{{- $args := list "server" (printf "--listen=0.0.0.0:%v" .Values.ports.grpc) (printf "--monitoring-listen=0.0.0.0:%v" .Values.ports.monitoring) -}}
{{- if eq .Values.caMode "cacerts" -}}
{{- $args = append $args "--ca-dir=/etc/cacerts" -}}
{{- else if eq .Values.caMode "upstream" -}}
{{- $u := .Values.upstream -}}
{{- $args = append $args (printf "--upstream=%s" $u.url) -}}
{{- $args = append $args (printf "--upstream-credentials=/etc/meshid/upstream/%s" $u.credentialsKey) -}}
{{- with $u.lifetime }}{{ $args = append $args (printf "--upstream-lifetime=%v" .) }}{{ end -}}
{{- with $u.renewAt }}{{ $args = append $args (printf "--upstream-renew-at=%v" .) }}{{ end -}}
{{- /* The elected replica mints; every replica signs with what it keeps in
the Secret meshid-ca-upstream (one mint per renewal across replicas). */ -}}
{{- $args = append $args "--kube-ca-secret" -}}
{{- else -}}
{{- $args = append $args "--kube-ca-secret" -}}
{{- end -}}
{{- $args = append $args "--state-dir=/var/lib/meshid" -}}
{{- $args = append $args (printf "--serving-dns-names=%s" (join "," $dns)) -}}
{{- $args = append $args (printf "--publish-root-configmap=%t" (ne (toString $s.publishRootConfigMap) "false")) -}}
{{- if $s.capTTLToToken -}}
{{- $args = append $args "--cap-ttl-to-token" -}}
{{- end -}}
{{- $flags := list
  (list "trust-domain" $s.trustDomain)
  (list "default-ttl" $s.defaultTTL)
  (list "max-ttl" $s.maxTTL)
  (list "root-key-type" $s.rootKeyType)
  (list "token-audiences" $s.tokenAudiences)
  (list "tokenreview-issuers" $s.tokenreviewIssuers)
  (list "token-verification" $s.tokenVerification)
  (list "apiserver-readiness-grace" $s.apiserverReadinessGrace)
  (list "jwt-issuer" $s.jwtIssuer)
  (list "max-token-lifetime" $s.maxTokenLifetime)
  (list "rate-limit" (ternary $s.rateLimit "" (and (not (kindIs "invalid" $s.rateLimit)) (ne (toString $s.rateLimit) "0"))))
  (list "kube-qps" $s.kubeQPS)
  (list "kube-burst" $s.kubeBurst)
  (list "root-configmap-namespaces" $s.rootConfigMapNamespaces)
  (list "trusted-node-accounts" $s.trustedNodeAccounts)
  (list "max-connections" $s.maxConnections)
  (list "max-connections-per-ip" $s.maxConnectionsPerIP)
  (list "first-request-timeout" $s.firstRequestTimeout)
  (list "serving-ttl" $s.servingTTL)
  (list "jwt-svid-ttl" $s.jwtSVIDTTL)
  (list "jwt-key-lifetime" $s.jwtKeyLifetime)
  (list "log-level" $s.logLevel)
  (list "log-format" $s.logFormat) -}}
{{- range $f := $flags -}}
{{- $name := index $f 0 -}}
{{- $v := index $f 1 -}}
{{- if kindIs "slice" $v -}}
{{- if $v -}}
{{- $args = append $args (printf "--%s=%s" $name (join "," $v)) -}}
{{- end -}}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) -}}
{{- $args = append $args (printf "--%s=%d" $name (int64 $v)) -}}
{{- else if not (or (kindIs "invalid" $v) (eq (toString $v) "")) -}}
{{- $args = append $args (printf "--%s=%v" $name $v) -}}
{{- end -}}
{{- end -}}
{{- /* Pod certificates (templates/rbac-pod-certificates.yaml). */ -}}
{{- with .Values.podCertificates.signerName -}}
{{- $args = append $args (printf "--pod-certificate-signer=%s" .) -}}
{{- with $.Values.podCertificates.refreshRatio -}}
{{- $args = append $args (printf "--pod-certificate-refresh-ratio=%v" .) -}}
{{- end -}}
{{- end -}}
{{- /* SPIFFE federation (values federation.*; files under /etc/meshid/federation). */ -}}
{{- $be := .Values.federation.bundleEndpoint -}}
{{- if $be.enabled -}}
{{- $args = append $args (printf "--bundle-endpoint-listen=0.0.0.0:%v" $be.port) -}}
{{- $args = append $args (printf "--bundle-endpoint-profile=%s" $be.profile) -}}
{{- if eq $be.profile "https_web" -}}
{{- $args = concat $args (list "--bundle-endpoint-cert=/etc/meshid/bundle-endpoint/tls.crt" "--bundle-endpoint-key=/etc/meshid/bundle-endpoint/tls.key") -}}
{{- end -}}
{{- with $be.refreshHint -}}
{{- $args = append $args (printf "--bundle-endpoint-refresh-hint=%s" .) -}}
{{- end -}}
{{- end -}}
{{- range $i, $p := .Values.federation.federateWith -}}
{{- $opts := list (printf "%s=%s" $p.trustDomain $p.url) -}}
{{- with $p.profile -}}{{- $opts = append $opts (printf "profile=%s" .) -}}{{- end -}}
{{- with $p.endpointID -}}{{- $opts = append $opts (printf "endpoint-id=%s" .) -}}{{- end -}}
{{- if $p.bundleConfigMap -}}{{- $opts = append $opts (printf "bundle=/etc/meshid/federation/%d/bundle/%s" $i ($p.bundleConfigMap.key | default "bundle")) -}}{{- end -}}
{{- if $p.caConfigMap -}}{{- $opts = append $opts (printf "ca-file=/etc/meshid/federation/%d/ca/%s" $i ($p.caConfigMap.key | default "ca.crt")) -}}{{- end -}}
{{- $args = append $args (printf "--federate-with=%s" (join "," $opts)) -}}
{{- end -}}
{{- range $s.extraArgs -}}
{{- $args = append $args (toString .) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{- define "meshid.validate" -}}
{{- if not (has .Values.caMode (list "cacerts" "kubeCASecret" "upstream")) -}}
{{- fail (printf "caMode must be cacerts, kubeCASecret or upstream, not %q" .Values.caMode) -}}
{{- end -}}
{{- if and (eq .Values.caMode "upstream") (or (not .Values.upstream.url) (not .Values.upstream.secretName) (not .Values.upstream.credentialsKey)) -}}
{{- fail "caMode upstream needs upstream.url, upstream.secretName and upstream.credentialsKey" -}}
{{- end -}}
{{- if not (has .Values.server.tokenVerification (list "auto" "local" "tokenreview")) -}}
{{- fail (printf "server.tokenVerification must be auto, local or tokenreview, not %q" .Values.server.tokenVerification) -}}
{{- end -}}
{{- if lt (int .Values.replicaCount) 1 -}}
{{- fail "replicaCount must be at least 1" -}}
{{- end -}}
{{- $be := .Values.federation.bundleEndpoint -}}
{{- if not (has $be.profile (list "https_spiffe" "https_web")) -}}
{{- fail (printf "federation.bundleEndpoint.profile must be https_spiffe or https_web, not %q" $be.profile) -}}
{{- end -}}
{{- if and $be.enabled (eq $be.profile "https_web") (not $be.certSecret) -}}
{{- fail "federation.bundleEndpoint.certSecret is required with the https_web profile" -}}
{{- end -}}
{{- range .Values.federation.federateWith -}}
{{- if or (not .trustDomain) (not .url) -}}
{{- fail (printf "federation.federateWith: every entry needs trustDomain and url (%v)" .) -}}
{{- end -}}
{{- if and (ne (.profile | default "https_spiffe") "https_web") (not .endpointID) -}}
{{- fail (printf "federation.federateWith %s: endpointID is required with the https_spiffe profile" .trustDomain) -}}
{{- end -}}
{{- end -}}
{{- end -}}
