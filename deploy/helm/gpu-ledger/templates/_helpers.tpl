{{/*
Labels of an object: the same two the Kustomize base writes on each object plus the two its
kustomization adds, with managed-by telling which tool applied it. Call with (list . "component").
*/}}
{{- define "gpu-ledger.labels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: gpu-ledger
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/part-of: gpu-ledger
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component (immutable on a DaemonSet: never add to them). */}}
{{- define "gpu-ledger.selectorLabels" -}}
app.kubernetes.io/name: gpu-ledger
app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "gpu-ledger.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The name Kustomize's configMapGenerator gives a ConfigMap: "<name>-<hash>", the hash being the
first 10 hex digits of sha256 over the JSON of {data, kind, name} with 0,1,3,a,e mapped to
g,h,k,m,t (sigs.k8s.io/kustomize/api/hasher). Kustomize 5.5-5.8 hash the generated object before
it has its name, so "name" is empty there (checked against `kubectl kustomize` by
tests/test_deploy_helm.py). The same name for the same content, so a changed cost model rolls
the CronJob's reference exactly as with Kustomize. Call with (dict "name" "data").
*/}}
{{- define "gpu-ledger.hashedName" -}}
{{- $hash := dict "kind" "ConfigMap" "name" "" "data" .data | toJson | sha256sum | trunc 10 -}}
{{- .name }}-{{ $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end }}

{{- define "gpu-ledger.meteringData" -}}
{{- $d := dict "prometheus-url" .Values.metering.prometheusUrl -}}
{{- with .Values.metering.selector }}{{ $_ := set $d "selector" . }}{{ end -}}
{{- with .Values.metering.cluster }}{{ $_ := set $d "cluster" . }}{{ end -}}
{{- with .Values.metering.clusterLabel }}{{ $_ := set $d "cluster-label" . }}{{ end -}}
{{- with .Values.metering.pushgatewayUrl }}{{ $_ := set $d "pushgateway" . }}{{ end -}}
{{- toYaml $d }}
{{- end }}

{{- define "gpu-ledger.scheme" -}}
{{ if .Values.exporter.webConfig.tls }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}
