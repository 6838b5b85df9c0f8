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

{{- define "gpuload.relayAuthSecret" -}}
{{- default (printf "%s-auth" (include "gpuload.relayName" .)) .Values.relay.auth.existingSecret }}
{{- end }}
