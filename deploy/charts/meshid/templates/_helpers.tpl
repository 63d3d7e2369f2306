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
{{- range $s.extraArgs -}}
{{- $args = append $args (toString .) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{- define "meshid.validate" -}}
{{- if not (has .Values.caMode (list "cacerts" "kubeCASecret")) -}}
{{- fail (printf "caMode must be cacerts or kubeCASecret, not %q" .Values.caMode) -}}
{{- end -}}
{{- if not (has .Values.server.tokenVerification (list "auto" "local" "tokenreview")) -}}
{{- fail (printf "server.tokenVerification must be auto, local or tokenreview, not %q" .Values.server.tokenVerification) -}}
{{- end -}}
{{- if lt (int .Values.replicaCount) 1 -}}
{{- fail "replicaCount must be at least 1" -}}
{{- end -}}
{{- end -}}
