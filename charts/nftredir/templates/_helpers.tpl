{{/* The name of every object of the release. */}}
{{- define "nftredir.name" -}}
{{- .Values.nameOverride | default "nftredir" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "nftredir.labels" -}}
{{ include "nftredir.selectorLabels" . }}
app.kubernetes.io/version: {{ include "nftredir.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* What the DaemonSet selects its pods by: fixed for a release. */}}
{{- define "nftredir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nftredir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nftredir.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "nftredir.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "nftredir.tag" .) -}}
{{- end -}}

{{/*
nftredir.paths is the host layout as YAML: files/platforms.yaml's
"default", then the platform's entry, then the values set under
hostPaths, seLinuxOptions and resourceQuota.enabled.
*/}}
{{- define "nftredir.paths" -}}
{{- $all := .Files.Get "files/platforms.yaml" | fromYaml -}}
{{- $name := .Values.platform | default "default" -}}
{{- if not (hasKey $all $name) -}}
{{- fail (printf "platform %q is not one of: %s" .Values.platform (without (keys $all | sortAlpha) "default" | join ", ")) -}}
{{- end -}}
{{- $p := merge (deepCopy (get $all $name)) (deepCopy $all.default) -}}
{{- $h := .Values.hostPaths -}}
{{- if $h.cniBinDirs }}{{ $_ := set $p "cniBinDirs" $h.cniBinDirs }}{{ end -}}
{{- if $h.cniConfDir }}{{ $_ := set $p "cniConfDir" $h.cniConfDir }}{{ end -}}
{{- if $h.netnsDirs }}{{ $_ := set $p "netnsDirs" $h.netnsDirs }}{{ end -}}
{{- if .Values.seLinuxOptions }}{{ $_ := set $p "seLinuxOptions" .Values.seLinuxOptions }}{{ end -}}
{{- if not (kindIs "invalid" .Values.resourceQuota.enabled) }}{{ $_ := set $p "resourceQuota" .Values.resourceQuota.enabled }}{{ end -}}
{{- $_ := set $p "runDir" $h.runDir -}}
{{- $_ := set $p "ztunnelDir" $h.ztunnelDir -}}
{{- $_ := set $p "nriDir" $h.nriDir -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
nftredir.dirType is the hostPath type of (list path mayCreate):
DirectoryOrCreate if it may be created, Directory if not or if it is
under /usr, which is read-only on image-based nodes (Bottlerocket,
Flatcar, Talos, COS): creating it there fails the pod.
*/}}
{{- define "nftredir.dirType" -}}
{{- $path := clean (index . 0) -}}
{{- if and (index . 1) (ne $path "/usr") (not (hasPrefix "/usr/" $path)) -}}
DirectoryOrCreate
{{- else -}}
Directory
{{- end -}}
{{- end -}}
