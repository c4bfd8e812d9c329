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

{{/* The name of the cluster-scoped objects (ClusterRole, ClusterRoleBinding,
ValidatingWebhookConfiguration): <fullname>-<namespace>, so the same release name in two
namespaces does not collide. Longer than 63 characters, it is cut to 54 and ends in 8 hex
digits of the sha256 of the whole name (still unique, still a valid label value). */}}
{{- define "ichor-rules.clusterScopedName" -}}
{{- $name := printf "%s-%s" (include "ichor-rules.fullname" .) .Release.Namespace }}
{{- if le (len $name) 63 }}
{{- $name }}
{{- else }}
{{- printf "%s-%s" ($name | trunc 54 | trimSuffix "-") ($name | sha256sum | trunc 8) }}
{{- end }}
{{- end }}

{{/* The name of a cluster-scoped object of one component: like clusterScopedName, with
"-<suffix>" before the namespace is added (dict "ctx" . "suffix" "webhook"). */}}
{{- define "ichor-rules.clusterScopedNameFor" -}}
{{- $name := printf "%s-%s-%s" (include "ichor-rules.fullname" .ctx) .suffix .ctx.Release.Namespace }}
{{- if le (len $name) 63 }}
{{- $name }}
{{- else }}
{{- printf "%s-%s" ($name | trunc 54 | trimSuffix "-") ($name | sha256sum | trunc 8) }}
{{- end }}
{{- end }}

{{/* The host part of the listen addresses: that of server.listen ("[::]" on an
IPv6-only cluster), or 0.0.0.0. */}}
{{- define "ichor-rules.listenHost" -}}
{{- with .Values.server.listen }}
{{- regexReplaceAll ":[0-9]+$" . "" }}
{{- else }}
{{- "0.0.0.0" }}
{{- end }}
{{- end }}

{{/* The roles of src/runtime/access.rs, as files/access.yaml carries them (generated from
the code; tests/chart.rs checks it): webhook, controller and metricsAuth, each with its
cluster-wide rules and its rules in the release namespace. */}}
{{- define "ichor-rules.access" -}}
{{- .Files.Get "files/access.yaml" }}
{{- end }}

{{/* The address `serve --listen` binds: server.listen, whose port must be
server.containerPort, or 0.0.0.0:<containerPort> when it is empty. */}}
{{- define "ichor-rules.listen" -}}
{{- $port := int .Values.server.containerPort }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "server.containerPort: %v is not a port (1 to 65535)" .Values.server.containerPort) }}
{{- end }}
{{- with .Values.server.listen }}
{{- $listenPort := regexFind ":[0-9]+$" . | trimPrefix ":" }}
{{- if ne $listenPort (toString $port) }}
{{- fail (printf "server.listen: %q must listen on server.containerPort (%d), the port the probes and the Service use; or leave server.listen empty to listen on 0.0.0.0:%d" . $port $port) }}
{{- end }}
{{- . }}
{{- else }}
{{- printf "0.0.0.0:%d" $port }}
{{- end }}
{{- end }}

{{/* Values the chart refuses at render time, each with the reason. */}}
{{- define "ichor-rules.validate" -}}
{{- $timeout := .Values.webhook.timeoutSeconds }}
{{- if or (lt (int $timeout) 1) (gt (int $timeout) 30) }}
{{- fail (printf "webhook.timeoutSeconds: %v is outside 1..30 (the range the API server accepts for a webhook's timeoutSeconds)" $timeout) }}
{{- end }}
{{- if ge (int .Values.server.readTimeoutMs) (mul (int $timeout) 1000) }}
{{- fail (printf "server.readTimeoutMs: %v must be below webhook.timeoutSeconds (%v s), so a slow live read is refused with a reason before the API server gives up" .Values.server.readTimeoutMs $timeout) }}
{{- end }}
{{- if not (has .Values.server.logFormat (list "text" "json")) }}
{{- fail (printf "server.logFormat: %q is neither \"text\" nor \"json\"" (toString .Values.server.logFormat)) }}
{{- end }}
{{- if or (lt (int .Values.server.maxInflightReads) 1) (gt (int .Values.server.maxInflightReads) 4096) }}
{{- fail (printf "server.maxInflightReads: %v is outside 1..4096 (the live reads each webhook pod has in flight at once)" .Values.server.maxInflightReads) }}
{{- end }}
{{- if or (lt (int .Values.server.maxConnections) 1) (gt (int .Values.server.maxConnections) 65536) }}
{{- fail (printf "server.maxConnections: %v is outside 1..65536" .Values.server.maxConnections) }}
{{- end }}
{{- range $key := list "tlsHandshakeTimeoutMs" "headerReadTimeoutMs" "bodyReadTimeoutMs" "idleTimeoutMs" }}
{{- if lt (int (index $.Values.server $key)) 1 }}
{{- fail (printf "server.%s: %v must be at least 1 (milliseconds; a stalled client is held until it passes)" $key (index $.Values.server $key)) }}
{{- end }}
{{- end }}
{{- if lt (int .Values.selfSignedCert.validityDays) 1 }}
{{- fail (printf "selfSignedCert.validityDays: %v must be at least 1" .Values.selfSignedCert.validityDays) }}
{{- end }}
{{- $sleep := int .Values.preStopSleepSeconds }}
{{- if lt $sleep 0 }}
{{- fail (printf "preStopSleepSeconds: %v must be 0 (no preStop hook) or more" .Values.preStopSleepSeconds) }}
{{- end }}
{{- if le (int .Values.terminationGracePeriodSeconds) $sleep }}
{{- fail (printf "terminationGracePeriodSeconds: %v must be larger than preStopSleepSeconds (%d), or the pod is killed before it has finished its requests" .Values.terminationGracePeriodSeconds $sleep) }}
{{- end }}
{{- if and (gt $sleep 0) (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "preStopSleepSeconds: the preStop sleep action needs Kubernetes 1.30 or later, and this is %s: set preStopSleepSeconds=0 (a rollout may then refuse writes for a moment)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- $_ := include "ichor-rules.listen" . }}
{{- with .Values.serviceAccount.name }}
{{- fail (printf "serviceAccount.name: %q is replaced by serviceAccount.webhookName and serviceAccount.controllerName (the webhook and the controller run as two ServiceAccounts with different rights; see docs/operators.md, Upgrading to two Deployments)" .) }}
{{- end }}
{{- if and .Values.controller.enabled (eq (include "ichor-rules.webhookServiceAccountName" .) (include "ichor-rules.controllerServiceAccountName" .)) }}
{{- fail (printf "serviceAccount: the webhook and the controller must run as different ServiceAccounts (both are %q): the webhook pods would get the controller's write rights" (include "ichor-rules.webhookServiceAccountName" .)) }}
{{- end }}
{{- range $what, $port := dict "server.containerPort" .Values.server.containerPort "metrics.port" .Values.metrics.port "server.healthPort" .Values.server.healthPort }}
{{- if or (lt (int $port) 1) (gt (int $port) 65535) }}
{{- fail (printf "%s: %v is not a port (1 to 65535)" $what $port) }}
{{- end }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.server.containerPort) }}
{{- fail (printf "metrics.port: %v is server.containerPort too; /metrics has a port of its own" .Values.metrics.port) }}
{{- end }}
{{- if eq (int .Values.server.healthPort) (int .Values.server.containerPort) }}
{{- fail (printf "server.healthPort: %v is server.containerPort too" .Values.server.healthPort) }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.server.healthPort) }}
{{- fail (printf "metrics.port: %v is server.healthPort too; /metrics has a port of its own" .Values.metrics.port) }}
{{- end }}
{{- if lt (int .Values.controller.replicas) 1 }}
{{- fail (printf "controller.replicas: %v must be at least 1 (2 keep a standby leader)" .Values.controller.replicas) }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "ichor-rules.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ichor-rules.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the release's pods (both components). */}}
{{- define "ichor-rules.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ichor-rules.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels that select one component's pods (dict "ctx" . "component" "webhook"). */}}
{{- define "ichor-rules.componentSelectorLabels" -}}
{{ include "ichor-rules.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The webhook pods' ServiceAccount: read-only, no Lease, no Talos credentials. */}}
{{- define "ichor-rules.webhookServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-webhook" (include "ichor-rules.fullname" .)) .Values.serviceAccount.webhookName }}
{{- else }}
{{- required "serviceAccount.webhookName must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.webhookName }}
{{- end }}
{{- end }}

{{/* The controller pods' ServiceAccount: the write RBAC. */}}
{{- define "ichor-rules.controllerServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-controller" (include "ichor-rules.fullname" .)) .Values.serviceAccount.controllerName }}
{{- else }}
{{- required "serviceAccount.controllerName must name an existing ServiceAccount when serviceAccount.create is false (another than serviceAccount.webhookName)" .Values.serviceAccount.controllerName }}
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

{{/* The pod's securityContext (both components). */}}
{{- define "ichor-rules.podSecurityContext" -}}
runAsNonRoot: true
{{- if not (kindIs "invalid" .Values.runAsUser) }}
runAsUser: {{ .Values.runAsUser }}
{{- end }}
{{- if not (kindIs "invalid" .Values.runAsGroup) }}
runAsGroup: {{ .Values.runAsGroup }}
fsGroup: {{ .Values.runAsGroup }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The container's securityContext (both components). */}}
{{- define "ichor-rules.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Spreading one component's replicas over nodes (dict "ctx" . "component" "webhook"). */}}
{{- define "ichor-rules.affinity" -}}
{{- $podAntiAffinity := .ctx.Values.podAntiAffinity }}
podAntiAffinity:
  {{- if eq $podAntiAffinity "required" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "ichor-rules.componentSelectorLabels" . | nindent 10 }}
  {{- else if eq $podAntiAffinity "preferred" }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "ichor-rules.componentSelectorLabels" . | nindent 12 }}
  {{- else }}
  {{- fail (printf "podAntiAffinity: %q is neither \"required\" nor \"preferred\"" $podAntiAffinity) }}
  {{- end }}
{{- end }}

{{/* The arguments both components pass to `serve`. */}}
{{- define "ichor-rules.commonArgs" -}}
- --rules=/etc/ichor-rules/rules
- --metrics-listen={{ include "ichor-rules.listenHost" . }}:{{ int .Values.metrics.port }}
{{- if .Values.metrics.insecure }}
- --metrics-insecure
{{- end }}
- --read-timeout-ms={{ int .Values.server.readTimeoutMs }}
- --reload-interval-ms={{ int .Values.server.reloadIntervalMs }}
- --log-format={{ .Values.server.logFormat }}
- --max-connections={{ int .Values.server.maxConnections }}
- --tls-handshake-timeout-ms={{ int .Values.server.tlsHandshakeTimeoutMs }}
- --header-read-timeout-ms={{ int .Values.server.headerReadTimeoutMs }}
- --body-read-timeout-ms={{ int .Values.server.bodyReadTimeoutMs }}
- --idle-timeout-ms={{ int .Values.server.idleTimeoutMs }}
- --identity=$(POD_NAME)
{{- range .Values.rules.audit }}
{{- if not (regexMatch "^[A-Za-z][A-Za-z0-9_-]*$" (toString .)) }}
{{- fail (printf "rules.audit: %q is not a rule name" (toString .)) }}
{{- end }}
- --audit-rule={{ . }}
{{- end }}
{{- range .Values.rules.enforce }}
{{- if not (regexMatch "^[A-Za-z][A-Za-z0-9_-]*$" (toString .)) }}
{{- fail (printf "rules.enforce: %q is not a rule name" (toString .)) }}
{{- end }}
- --enforce-rule={{ . }}
{{- end }}
{{- end }}

{{/* The environment both components get. */}}
{{- define "ichor-rules.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RUST_LOG
  value: {{ .Values.server.logLevel | quote }}
{{- end }}

{{/* "true" when the controller links its records to the webhook's admissions by asking
the webhook pods (`serve --admissions-url`): a controller runs, the webhook keeps its
decisions (webhook.decisionLog is not off) and its metrics port checks tokens (the lookup
is answered only to a caller allowed `get` on the non-resource URL /admissions). */}}
{{- define "ichor-rules.admissionsLink" -}}
{{- if and .Values.controller.enabled (not .Values.metrics.insecure) (ne (toString .Values.webhook.decisionLog) "off") }}true{{ end }}
{{- end }}

{{/* The headless Service whose addresses are the webhook pods (each asked for the
admissions it kept). */}}
{{- define "ichor-rules.webhookPeersName" -}}
{{- printf "%s-webhook-peers" (include "ichor-rules.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when the webhook pods make and keep their certificates themselves (`serve
--tls-secret`, the default): neither cert-manager nor selfSignedCert.generateInChart. */}}
{{- define "ichor-rules.ownCerts" -}}
{{- if not (or .Values.certManager.enabled .Values.selfSignedCert.generateInChart) }}true{{ end }}
{{- end }}
