{{/* The chart name, or nameOverride. */}}
{{- define "ichor-rules.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: fullnameOverride, or <release>-<chart> (just the
release name when it already contains the chart name). */}}
{{- define "ichor-rules.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "ichor-rules.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ichor-rules.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "ichor-rules.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ichor-rules.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ichor-rules.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ichor-rules.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding tls.crt, tls.key and ca.crt (cert-manager's or the chart's). */}}
{{- define "ichor-rules.tlsSecretName" -}}
{{- printf "%s-tls" (include "ichor-rules.fullname" .) }}
{{- end }}

{{/* The ConfigMap the rules are mounted from. */}}
{{- define "ichor-rules.rulesConfigMapName" -}}
{{- if .Values.rules.existingConfigMap }}
{{- .Values.rules.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "ichor-rules.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS names the API server uses to reach the Service. */}}
{{- define "ichor-rules.dnsNames" -}}
{{- $svc := include "ichor-rules.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* The webhooks' namespaceSelector: the user's selector, with the release namespace
always excluded. */}}
{{- define "ichor-rules.namespaceSelector" -}}
{{- $user := .Values.webhook.namespaceSelector | default dict }}
{{- $own := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list .Release.Namespace) }}
{{- range $k, $_ := $user }}
{{- if not (has $k (list "matchLabels" "matchExpressions")) }}
{{- fail (printf "webhook.namespaceSelector.%s: a label selector has only matchLabels and matchExpressions" $k) }}
{{- end }}
{{- end }}
{{- $exprs := append (default list $user.matchExpressions) $own }}
{{- $sel := dict "matchExpressions" $exprs }}
{{- with $user.matchLabels }}
{{- $_ := set $sel "matchLabels" . }}
{{- end }}
{{- toYaml $sel }}
{{- end }}
