{{/*
The labels of every object: the ones the kustomize manifests carry (name, component,
part-of), then Helm's own (chart, managed-by, instance, version).
Call with (dict "context" $ "component" "agent"); component "" leaves it out.
*/}}
{{- define "migpart.labels" -}}
app.kubernetes.io/name: migpart
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
app.kubernetes.io/part-of: migpart
{{ include "migpart.helmLabels" .context }}
{{- end }}

{{/* Helm's own labels, the only ones the kustomize manifests lack. */}}
{{- define "migpart.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The selector of a component's pods (immutable: no Helm labels). */}}
{{- define "migpart.selectorLabels" -}}
app.kubernetes.io/name: migpart
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* repository@digest when a digest is given, else repository:tag (tag: appVersion). */}}
{{- define "migpart.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* imagePullSecrets of both pod specs. */}}
{{- define "migpart.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations, affinity, priorityClassName of a component's values. */}}
{{- define "migpart.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
