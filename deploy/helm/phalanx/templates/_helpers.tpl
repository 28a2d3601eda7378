{{/*
The chart's name, or nameOverride (the app.kubernetes.io/name label).
*/}}
{{- define "phalanx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: fullnameOverride, else the release name when it already
contains the chart's name (release "phalanx" -> "phalanx"), else "<release>-<chart>".
Kept to 40 characters so that "<prefix>-node-discover" and the like stay valid label values.
*/}}
{{- define "phalanx.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "phalanx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of one component: include "phalanx.selectorLabels" (list $ "scheduler")
*/}}
{{- define "phalanx.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "phalanx.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
Standard labels of one component: include "phalanx.labels" (list $ "scheduler")
*/}}
{{- define "phalanx.labels" -}}
{{- $ := index . 0 -}}
{{ include "phalanx.selectorLabels" . }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/part-of: phalanx
helm.sh/chart: {{ include "phalanx.chart" $ }}
{{- end }}

{{/*
The image every component runs.
*/}}
{{- define "phalanx.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) }}
{{- end }}

{{/*
Names the code fixes (no flag sets them); see values.yaml.
*/}}
{{- define "phalanx.leaseName" -}}phalanx-scheduler{{- end }}

{{/*
The Leases and attained-service ConfigMaps the schedulers hold: one of each, or one per shard
(the code adds "-<shard>"): include "phalanx.perShard" (list $ "phalanx-scheduler")
*/}}
{{- define "phalanx.perShard" -}}
{{- $ := index . 0 -}}
{{- $base := index . 1 -}}
{{- if $.Values.shards -}}
{{- $names := list -}}
{{- range $.Values.shards }}{{ $names = append $names (printf "%s-%s" $base (toString .name)) }}{{ end -}}
{{ join ", " $names }}
{{- else -}}
{{ $base }}
{{- end -}}
{{- end }}

{{/*
The scheduling shards file (`phalanx scheduler --shards`): every shard's name and pools.
*/}}
{{- define "phalanx.shardsFile" -}}
labels: {{ toJson (.Values.shardLabels | default (list "phalanx.io/node-pool" "kai.scheduler/node-pool")) }}
shards:
{{- range .Values.shards }}
  - name: {{ toJson (toString .name) }}
    pools: {{ toJson (.pools | default list) }}
    default: {{ .default | default false }}
    {{- if .profile }}
    profile: {{ toJson (toString .profile) }}
    {{- end }}
{{- end }}
{{- end }}
{{- define "phalanx.webhookSecretSelf" -}}phalanx-webhook-tls{{- end }}
{{- define "phalanx.reservationName" -}}phalanx-gpu-reservation{{- end }}

{{/*
The MutatingWebhookConfiguration: mode=self patches the caBundle of phalanx-gpu-shares only (a
name fixed in phalanx.k8s.admission.webhook); the other modes never touch it, so it follows the release.
*/}}
{{- define "phalanx.webhookConfigName" -}}
{{- if eq .Values.webhook.certificate.mode "self" -}}
phalanx-gpu-shares
{{- else -}}
{{ include "phalanx.fullname" . }}-gpu-shares
{{- end }}
{{- end }}

{{- define "phalanx.webhookService" -}}{{ include "phalanx.fullname" . }}-webhook{{- end }}

{{/*
Whether the scheduler makes GPU reservation pods.
*/}}
{{- define "phalanx.reservations" -}}
{{- if eq (toString .Values.scheduler.gpuShares) "reservation" }}true{{ end }}
{{- end }}

{{/*
What the scheduler adds to its GPU reservation pods (--reservation-pod), as YAML; empty when
nothing is (reservations.runtimeClassName, env, volumes, volumeMounts, and the global extraEnv).
*/}}
{{- define "phalanx.reservationPod" -}}
{{- if include "phalanx.reservations" . -}}
{{- $r := .Values.reservations -}}
{{- $pod := dict -}}
{{- with $r.runtimeClassName }}{{ $_ := set $pod "runtimeClassName" . }}{{ end -}}
{{- with include "phalanx.extraEnv" (list . $r) }}{{ $_ := set $pod "env" (fromYamlArray .) }}{{ end -}}
{{- with $r.volumes }}{{ $_ := set $pod "volumes" . }}{{ end -}}
{{- with $r.volumeMounts }}{{ $_ := set $pod "volumeMounts" . }}{{ end -}}
{{- if $pod }}{{ toYaml $pod }}{{ end -}}
{{- end -}}
{{- end }}

{{/*
Values that must agree with each other; a wrong one stops the render with a message.
*/}}
{{- define "phalanx.validate" -}}
{{- $shares := toString .Values.scheduler.gpuShares }}
{{- if not (has $shares (list "off" "reservation")) }}
{{- fail (printf "scheduler.gpuShares must be \"off\" or \"reservation\", got %q" $shares) }}
{{- end }}
{{- if and (eq $shares "reservation") (not .Values.webhook.enabled) }}
{{- fail "scheduler.gpuShares=reservation needs webhook.enabled=true (the webhook gives each share pod its ConfigMap)" }}
{{- end }}
{{- $mode := toString .Values.webhook.certificate.mode }}
{{- if not (has $mode (list "self" "certManager" "provided")) }}
{{- fail (printf "webhook.certificate.mode must be self, certManager or provided, got %q" $mode) }}
{{- end }}
{{- if and .Values.webhook.enabled (eq $mode "provided") (not .Values.webhook.certificate.secretName) }}
{{- fail "webhook.certificate.mode=provided needs webhook.certificate.secretName" }}
{{- end }}
{{- $owner := dict }}
{{- $defaults := list }}
{{- range $i, $sh := .Values.shards | default list }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$" (toString $sh.name)) }}
{{- fail (printf "shards[%d].name must be a DNS label of at most 40 characters, got %q" $i (toString $sh.name)) }}
{{- end }}
{{- range $pool := $sh.pools | default list }}
{{- if hasKey $owner (toString $pool) }}
{{- fail (printf "shards: pool %q is in shards %q and %q: a node has one owner" (toString $pool) (get $owner (toString $pool)) (toString $sh.name)) }}
{{- end }}
{{- $_ := set $owner (toString $pool) (toString $sh.name) }}
{{- end }}
{{- if $sh.default }}{{ $defaults = append $defaults (toString $sh.name) }}{{ end }}
{{- if and (not $sh.pools) (not $sh.default) }}
{{- fail (printf "shards[%d] (%s) owns nothing: give it pools, or default: true" $i (toString $sh.name)) }}
{{- end }}
{{- end }}
{{- if gt (len $defaults) 1 }}
{{- fail (printf "shards: %s are all default: one at most" (join ", " $defaults)) }}
{{- end }}
{{- end }}

{{/*
Pod-level settings every workload takes from its component's values:
include "phalanx.podSettings" (list $ .Values.scheduler)
*/}}
{{- define "phalanx.podSettings" -}}
{{- $ := index . 0 -}}
{{- $c := index . 1 -}}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if $c.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with $c.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $c.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The image of a container: include "phalanx.containerImage" .
*/}}
{{- define "phalanx.containerImage" -}}
image: {{ include "phalanx.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end }}

{{/*
resources and securityContext of a container, from its component's values:
include "phalanx.containerResources" .Values.scheduler
*/}}
{{- define "phalanx.containerResources" -}}
{{- with .resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The extra environment of a container, as YAML list items: the component's env, then the global
extraEnv (empty when there is none), values as strings (`--set extraEnv[0].value=6443` gives a
number). After the container's own variables:
  {{- with include "phalanx.extraEnv" (list $ .Values.scheduler) }}{{ . | nindent 12 }}{{ end }}
*/}}
{{- define "phalanx.extraEnv" -}}
{{- $ := index . 0 -}}
{{- $c := index . 1 -}}
{{- $env := list -}}
{{- range concat ($c.env | default list) ($.Values.extraEnv | default list) -}}
{{- $e := deepCopy . -}}
{{- if hasKey $e "value" }}{{ $_ := set $e "value" (toString $e.value) }}{{ end -}}
{{- $env = append $env $e -}}
{{- end -}}
{{- if $env }}{{ toYaml $env }}{{ end -}}
{{- end }}

{{/*
The distributed cache's SeaweedFS image, and the addresses its pieces reach the master and the
filer at (host:port.grpcPort, weed's form): distcache.master.address / distcache.filer.address,
else the headless Service's name of the StatefulSet's one pod.
*/}}
{{- define "phalanx.distcacheImage" -}}
{{- $i := .Values.distcache.image -}}
image: {{ printf "%s:%s" $i.repository (toString $i.tag) }}
imagePullPolicy: {{ $i.pullPolicy }}
{{- end }}

{{- define "phalanx.distcacheMaster" -}}
{{- $m := .Values.distcache.master -}}
{{- if $m.address -}}
{{ $m.address }}
{{- else -}}
{{ printf "%s-distcache-master-0.%s-distcache-master.%s.svc:%v.%v" (include "phalanx.fullname" .) (include "phalanx.fullname" .) .Release.Namespace $m.port $m.grpcPort }}
{{- end -}}
{{- end }}

{{- define "phalanx.distcacheFiler" -}}
{{- $f := .Values.distcache.filer -}}
{{- if $f.address -}}
{{ $f.address }}
{{- else -}}
{{ printf "%s-distcache-filer-0.%s-distcache-filer.%s.svc:%v.%v" (include "phalanx.fullname" .) (include "phalanx.fullname" .) .Release.Namespace $f.port $f.grpcPort }}
{{- end -}}
{{- end }}
