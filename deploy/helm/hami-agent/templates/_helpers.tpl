{{- define "hami-agent.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hami-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hami-agent.labels" -}}
{{ include "hami-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
Whether a prometheus-operator object is rendered: "true" or "". The value is auto (only when
the cluster serves monitoring.coreos.com/v1), true or false. Call with (list .Values.x.enabled $).
*/}}
{{- define "hami-agent.monitoringEnabled" -}}
{{- $v := index . 0 -}}
{{- $root := index . 1 -}}
{{- if eq (toString $v) "auto" -}}
{{- if $root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- else if eq (toString $v) "true" -}}true
{{- end -}}
{{- end -}}

{{/*
The pod's affinity: .Values.affinity, plus a required nodeAffinity on the GPU-node labels
(gpuNodeAffinity) unless .Values.affinity has its own nodeAffinity.
*/}}
{{- define "hami-agent.affinity" -}}
{{- $aff := deepCopy (default (dict) .Values.affinity) -}}
{{- if and .Values.gpuNodeAffinity.enabled (not (hasKey $aff "nodeAffinity")) .Values.gpuNodeAffinity.labels -}}
{{- $terms := list -}}
{{- range .Values.gpuNodeAffinity.labels -}}
{{- $terms = append $terms (dict "matchExpressions" (list (dict "key" .key "operator" "In" "values" .values))) -}}
{{- end -}}
{{- $_ := set $aff "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) -}}
{{- end -}}
{{- if $aff -}}
{{- toYaml $aff -}}
{{- end -}}
{{- end -}}
