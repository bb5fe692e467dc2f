{{/* Names: "hami" for a release called hami (or containing it), else <release>-hami. */}}
{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "hami.scheduler" -}}{{ include "hami.fullname" . }}-scheduler{{- end -}}
{{- define "hami.node" -}}{{ include "hami.fullname" . }}-node{{- end -}}
{{- define "hami.config" -}}{{ include "hami.fullname" . }}-config{{- end -}}
{{- define "hami.kubeSchedulerConfig" -}}{{ include "hami.fullname" . }}-kube-scheduler{{- end -}}
{{- define "hami.webhook" -}}{{ include "hami.fullname" . }}-webhook{{- end -}}
{{/* kube-scheduler's Lease; hami's own is named like the scheduler and follows it. */}}
{{- define "hami.kubeSchedulerLease" -}}{{ include "hami.fullname" . }}-kube-scheduler{{- end -}}
{{/* The webhook's serving certificate: the scheduler's own, or cert-manager's. */}}
{{- define "hami.tlsSecret" -}}{{ include "hami.scheduler" . }}-tls{{- end -}}

{{- define "hami.serviceAccountUser" -}}
system:serviceaccount:{{ include "hami.namespace" .root }}:{{ .name }}
{{- end -}}

{{/* Labels of every object; "component" is the role's name. */}}
{{- define "hami.labels" -}}
app.kubernetes.io/part-of: hami
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one role: (dict "root" $ "name" <role name>). The name alone: it
     already carries the release's name, and the plain manifests selected by it (a selector
     cannot change, so `helm upgrade` over them keeps working). */}}
{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
{{- end -}}

{{/* registry/repository:tag; global.imageRegistry replaces the image's own registry.
     (dict "image" <image values> "global" .Values.global "tag" <default tag>) */}}
{{- define "hami.image" -}}
{{- $registry := default .image.registry .global.imageRegistry -}}
{{- $tag := default .tag .image.tag | toString -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "hami.appTag" -}}
{{- default .Chart.AppVersion .Values.global.imageTag -}}
{{- end -}}

{{/* kube-scheduler follows the cluster: v1.31.1+k3s1 -> v1.31.1. */}}
{{- define "hami.kubeSchedulerTag" -}}
{{- regexReplaceAll "^(v[0-9]+\\.[0-9]+\\.[0-9]+).*$" .Capabilities.KubeVersion.Version "${1}" -}}
{{- end -}}

{{/* imagePullSecrets of a pod from global, top-level and its images' pullSecrets. */}}
{{- define "hami.pullSecrets" -}}
{{- $names := list -}}
{{- range (concat .root.Values.global.imagePullSecrets .root.Values.imagePullSecrets) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- range .images -}}
{{- range .pullSecrets -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- if $names }}
imagePullSecrets:
{{- range ($names | uniq) }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Every resource name kube-scheduler leaves to the extender: each backend's resources in
     hami.yaml (so both configs name the same ones) and the task priority. Backends in
     mode dra are left out: kube-scheduler allocates their claims itself (docs/dra.md);
     empty when every backend is, and then kube-scheduler gets no extender at all.
     (dict "root" $ "cfg" <hami.configData as a mapping>) */}}
{{- define "hami.managedResources" -}}
{{- $names := list -}}
{{- range $backend := (list "nvidia" "mlu") -}}
{{- if ne ((index $.cfg.backends $backend).mode | default "extender") "dra" -}}
{{- $resources := (index $.cfg.backends $backend).resources -}}
{{- range $key := (list "count" "memory" "memory_percentage" "cores") -}}
{{- with (index $resources $key) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- if eq $backend "nvidia" -}}
{{- $names = append $names $.root.Values.resourcePriority -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $names }}
- {name: {{ . }}, ignoredByScheduler: true}
{{- end }}
{{- end -}}

{{/* hami.yaml as a mapping: what the values say, with .Values.config merged over it. The
     workloads read their ports and paths from it, so an override moves both. */}}
{{- define "hami.configData" -}}
{{- $v := .Values -}}
{{- $policy := $v.scheduler.defaultSchedulerPolicy -}}
{{- $cfg := dict
  "log" (dict "format" "json" "level" $v.logLevel)
  "node" (dict
    "device_plugin_dir" $v.devicePlugin.pluginPath
    "http" (dict "address" "0.0.0.0" "port" 9394))
  "scheduler" (dict
    "scheduler_name" $v.schedulerName
    "node_lock_timeout" $v.scheduler.nodeLockExpire
    "node_policy" $policy.nodeSchedulerPolicy
    "device_policy" $policy.gpuSchedulerPolicy
    "http" (dict "address" "0.0.0.0" "port" 9395)
    "extender" (dict "address" "127.0.0.1" "port" 9396)
    "webhook" (dict
      "enabled" $v.scheduler.admissionWebhook.enabled
      "address" "0.0.0.0"
      "port" 9443
      "tls_mode" (ternary "cert-manager" "self" $v.scheduler.certManager.enabled)
      "secret_name" (include "hami.tlsSecret" .)
      "service_name" (include "hami.scheduler" .)
      "configuration_name" (include "hami.webhook" .)
      "cert_file" "/etc/hami/tls/tls.crt"
      "key_file" "/etc/hami/tls/tls.key")
    "leader_election" (dict
      "enabled" $v.scheduler.leaderElect
      "lease_name" (include "hami.scheduler" .)
      "lease_duration" $v.scheduler.leaderElection.leaseDuration
      "renew_deadline" $v.scheduler.leaderElection.renewDeadline
      "retry_period" $v.scheduler.leaderElection.retryPeriod
      "follow_kube_scheduler" (printf "%s/%s" (include "hami.namespace" .) (include "hami.kubeSchedulerLease" .))))
  "backends" (dict
    "nvidia" (dict
      "enabled" true
      "split_count" $v.devicePlugin.deviceSplitCount
      "memory_scaling" $v.devicePlugin.deviceMemoryScaling
      "core_scaling" $v.devicePlugin.deviceCoreScaling
      "resources" (dict
        "count" $v.resourceName
        "memory" $v.resourceMem
        "memory_percentage" $v.resourceMemPercentage
        "cores" $v.resourceCores))
    "mlu" (dict
      "resources" (dict
        "count" $v.mluResourceName
        "memory" $v.mluResourceMem
        "cores" $v.mluResourceCores
        "memory_unit_mib" 256)))
-}}
{{- if eq $v.devicePlugin.mode "dra" -}}
{{- range $backend := (list "nvidia" "mlu") -}}
{{- $_ := set (index $cfg.backends $backend) "mode" "dra" -}}
{{- end -}}
{{- $_ := set $cfg.node "dra" (dict
  "plugins_dir" "/var/lib/kubelet/plugins"
  "registry_dir" "/var/lib/kubelet/plugins_registry"
  "cdi_dir" "/var/run/cdi") -}}
{{- end -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy $v.config)) -}}
{{- end -}}
