{{/*
app.kubernetes.io/name of every object: nameOverride, else the chart's name (migpart).
*/}}
{{- define "migpart.name" -}}
{{- default .Chart.Name .Values.nameOverride }}
{{- end }}

{{/*
The prefix of the objects' names (migpart-operator, migpart-agent-metrics, ...):
fullnameOverride, else the name. The release name is no part of it: migpart is one per cluster
(its CRDs, DeviceClass and admission policy are cluster-wide), and a release named otherwise
keeps the names the docs and the kustomize manifests use. values.schema.json keeps it short
enough for the longest Service name (<prefix>-operator-metrics, 63 characters at most).
*/}}
{{- define "migpart.fullname" -}}
{{- default (include "migpart.name" .) .Values.fullnameOverride }}
{{- end }}

{{/*
The ServiceAccount of a component: its serviceAccount.name, else <fullname>-<component>.
Call with (dict "context" $ "component" "agent").
*/}}
{{- define "migpart.serviceAccountName" -}}
{{- $values := index .context.Values .component }}
{{- default (printf "%s-%s" (include "migpart.fullname" .context) .component) $values.serviceAccount.name }}
{{- end }}

{{/*
The labels of every object: the ones the kustomize manifests carry (name, component,
part-of), then Helm's own (chart, managed-by, instance, version).
Call with (dict "context" $ "component" "agent"); component "" leaves it out.
*/}}
{{- define "migpart.labels" -}}
app.kubernetes.io/name: {{ include "migpart.name" .context }}
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

{{/*
The labels of a component's pods: the objects' labels, then the component's podLabels
(those that would replace one of the chart's are left out: the selector depends on them).
Call with (dict "context" $ "component" "agent").
*/}}
{{- define "migpart.podLabels" -}}
{{- $labels := include "migpart.labels" . }}
{{- $ours := fromYaml $labels }}
{{- $labels }}
{{- range $key, $value := (index .context.Values .component).podLabels }}
{{- if not (hasKey $ours $key) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The selector of a component's pods (immutable: no Helm labels).
Call with (dict "context" $ "component" "agent").
*/}}
{{- define "migpart.selectorLabels" -}}
app.kubernetes.io/name: {{ include "migpart.name" .context }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
repository@digest when a digest is given, else repository:tag (tag: appVersion). The default
repository is a placeholder: rendering fails until it names the registry the image was pushed to.
*/}}
{{- define "migpart.image" -}}
{{- if eq .Values.image.repository "REGISTRY/migpart" }}
{{- fail "image.repository is left at its placeholder REGISTRY/migpart: push the image to your registry (docs/install.md) and set image.repository" }}
{{- end }}
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

{{/*
agent.nodeSelector as the operator's --node-selector (key=value, keys sorted, joined by commas;
"" for an empty selector: every node), so that the operator publishes devices on exactly the
nodes the agents run on.
*/}}
{{- define "migpart.nodeSelectorFlag" -}}
{{- $parts := list }}
{{- range $key, $value := .Values.agent.nodeSelector }}
{{- if not (kindIs "invalid" $value) }}
{{- $parts = append $parts (printf "%s=%s" $key $value) }}
{{- end }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{/*
nodeSelector, tolerations, affinity, priorityClassName of a component's pods. The operator's
replicas prefer distinct nodes unless operator.affinity says otherwise.
Call with (dict "context" $ "component" "agent").
*/}}
{{- define "migpart.scheduling" -}}
{{- $values := index .context.Values .component }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $values.affinity }}
affinity:
  {{- toYaml $values.affinity | nindent 2 }}
{{- else if eq .component "operator" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "migpart.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}
