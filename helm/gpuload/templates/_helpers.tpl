{{/* Names and labels, the way `helm create` spells them. */}}
{{- define "gpuload.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuload.fullname" -}}
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

{{/* The relay's objects: the fullname with "-relay", within 63 characters. */}}
{{- define "gpuload.relayName" -}}
{{- printf "%s-relay" (include "gpuload.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* Labels of every object besides its selector labels (gpuload.selectorLabels or
gpuload.instanceLabels, which follow them). */}}
{{- define "gpuload.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuload
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpuload.instanceLabels" -}}
app.kubernetes.io/name: {{ include "gpuload.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: exporter or relay. */}}
{{- define "gpuload.selectorLabels" -}}
{{ include "gpuload.instanceLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpuload.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuload.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpuload.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Seconds in a Prometheus duration made of d/h/m/s parts: "1h30m" -> 5400. */}}
{{- define "gpuload.seconds" -}}
{{- $seconds := 0 }}
{{- range $unit, $factor := dict "d" 86400 "h" 3600 "m" 60 "s" 1 }}
{{- $part := regexFind (printf "[0-9]+%s" $unit) $ }}
{{- if $part }}
{{- $seconds = add $seconds (mul (trimSuffix $unit $part | atoi) $factor) }}
{{- end }}
{{- end }}
{{- $seconds }}
{{- end }}

{{/* The environment variable carrying a relay target's secret: RELAY_TARGET_<TARGET>_<KEY>. */}}
{{- define "gpuload.relaySecretEnv" -}}
{{- regexReplaceAll "[^A-Z0-9_]" (printf "RELAY_TARGET_%s_%s" .target .key | upper) "_" }}
{{- end }}

{{/*
"true" when the relay runs: enabled and with a target. Without one `gpuload relay` refuses to
start (it would accept every notification and deliver none), so the chart deploys nothing for it
and NOTES.txt says what to set. Targets without a route fail the render with the fix.
*/}}
{{- define "gpuload.relayRuns" -}}
{{- if and .Values.relay.enabled .Values.relay.targets -}}
{{- if not .Values.relay.route -}}
{{- fail "relay.route: give the top route's targets (the default), e.g. {targets: [slack-ops]}, as in docs/relay.md; without a route gpuload relay refuses to start" -}}
{{- end -}}
true
{{- end -}}
{{- end }}

{{- define "gpuload.relayAuthSecret" -}}
{{- default (printf "%s-auth" (include "gpuload.relayName" .)) .Values.relay.auth.existingSecret }}
{{- end }}

{{/* The exporter's Prometheus job, set by the monitor's relabelling: deterministic whatever the
Service or PodMonitor is called, and never the relay's (<fullname>-relay). */}}
{{- define "gpuload.jobName" -}}
{{- default (include "gpuload.name" .) .Values.serviceMonitor.jobName }}
{{- end }}

{{/* "true" when a Prometheus Operator object is to be rendered, else empty. .key is its values
section (enabled: auto, true or false), .kind its kind in monitoring.coreos.com/v1. */}}
{{- define "gpuload.operatorObject" -}}
{{- $enabled := index .root.Values .key "enabled" }}
{{- $api := printf "monitoring.coreos.com/v1/%s" .kind }}
{{- $served := .root.Capabilities.APIVersions.Has $api }}
{{- if eq (toString $enabled) "auto" }}
{{- if $served }}true{{ end }}
{{- else if $enabled }}
{{- if not $served }}
{{- fail (printf "%s.enabled is true but this cluster has no %s: install the Prometheus Operator's CRDs first (kube-prometheus-stack, or the prometheus-operator-crds chart), or set %s.enabled=auto to leave it out. helm template knows no cluster: pass --api-versions %s." .key $api .key $api) }}
{{- end }}
{{- print "true" }}
{{- end }}
{{- end }}

{{/* The kind that scrapes the exporter: PodMonitor, ServiceMonitor, or empty. */}}
{{- define "gpuload.exporterMonitor" -}}
{{- if .Values.podMonitor.enabled }}
{{- if eq (toString .Values.serviceMonitor.enabled) "true" }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: the exporter would be scraped twice. Keep one (serviceMonitor.enabled=auto or false with the PodMonitor)." }}
{{- end }}
{{- if include "gpuload.operatorObject" (dict "root" . "key" "podMonitor" "kind" "PodMonitor") }}PodMonitor{{ end }}
{{- else if include "gpuload.operatorObject" (dict "root" . "key" "serviceMonitor" "kind" "ServiceMonitor") }}ServiceMonitor
{{- end }}
{{- end }}

{{/* "true" when shared-GPU attribution is on: every process on a GPU mapped to its pod
through /proc/PID/cgroup and the API server's pods of the node. It builds on pod attribution
(the root user, the kubelet's socket), so it fails without it. */}}
{{- define "gpuload.sharedGPUs" -}}
{{- $podResources := .Values.exporter.podResources }}
{{- if $podResources.sharedGPUs }}
{{- if not $podResources.enabled }}
{{- fail "exporter.podResources.sharedGPUs needs exporter.podResources.enabled: true (shared-GPU attribution extends pod attribution and runs as its root user); set both or neither." }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}

{{/* The exporter container's security context: the values' with the chart's identity, root
with no capabilities when it must connect to the kubelet's root-only pod-resources socket,
uid 10001 otherwise. A privileged container (GKE's managed drivers) escalates by definition. */}}
{{- define "gpuload.exporterSecurityContext" -}}
{{- $identity := dict "runAsUser" 10001 "runAsGroup" 10001 "runAsNonRoot" true }}
{{- if .Values.exporter.podResources.enabled }}
{{- $identity = dict "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false }}
{{- end }}
{{- $context := mergeOverwrite $identity (deepCopy .Values.exporter.securityContext) }}
{{- if $context.privileged }}
{{- $_ := set $context "allowPrivilegeEscalation" true }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/* Where the exporter's web config file is: in the ConfigMap, or written by the init
container when basic auth needs the password's hash. Empty without TLS or basic auth. */}}
{{- define "gpuload.webConfigFile" -}}
{{- if .Values.web.basicAuth.existingSecret }}/run/gpuload/web.yml
{{- else if .Values.web.tls.existingSecret }}/etc/gpuload/web.yml
{{- end }}
{{- end }}

{{/* A probe of the exporter: HTTPS when it serves TLS. */}}
{{- define "gpuload.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .root.Values.web.tls.existingSecret $probe.httpGet }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/* The scrape settings the ServiceMonitor and the PodMonitor share (one endpoint). */}}
{{- define "gpuload.scrapeEndpoint" -}}
{{- $monitor := .Values.serviceMonitor }}
{{- $web := .Values.web }}
port: metrics
path: {{ default "/metrics" (dig "web" "telemetry_path" "" .Values.exporter.config) }}
interval: {{ $monitor.interval }}
scrapeTimeout: {{ $monitor.scrapeTimeout }}
honorLabels: {{ $monitor.honorLabels }}
{{- if $web.tls.existingSecret }}
scheme: https
tlsConfig:
  {{- $default := dict "ca" (dict "secret" (dict "name" $web.tls.existingSecret "key" $web.tls.secretKeys.ca)) "serverName" (printf "%s.%s.svc" (include "gpuload.fullname" .) .Release.Namespace) }}
  {{- toYaml (default $default $monitor.tlsConfig) | nindent 2 }}
{{- end }}
{{- with $web.basicAuth.existingSecret }}
basicAuth:
  username:
    name: {{ . }}
    key: {{ $web.basicAuth.secretKeys.username }}
  password:
    name: {{ . }}
    key: {{ $web.basicAuth.secretKeys.password }}
{{- end }}
relabelings:
  # gpuload exports no hostname label: the node comes from service discovery.
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
    action: replace
  # And the instance is the node, not the pod's address, as kube-prometheus does for
  # node-exporter: a restarted pod (a new IP) stays the same instance, which the
  # GPUCountDropped, GPUVanished and GPUFellOffBus alerts need to see across restarts.
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
    action: replace
  # The job the PrometheusRule's exporter_job_regex names.
  - targetLabel: job
    replacement: {{ include "gpuload.jobName" . }}
    action: replace
  {{- if $monitor.honorLabels }}
  # The exporter's own pod and container are no label of its series: with honorLabels a series
  # without `pod` (a GPU no pod holds) would take them, and a cost tool's container!="" would
  # bill gpuload for it. The series of a GPU a pod holds carry that pod's.
  - action: labeldrop
    regex: pod|container
  {{- end }}
  {{- with $monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
