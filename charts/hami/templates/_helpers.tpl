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

{{/* hami's own image tag when an image's tag is empty. Not global.imageTag: that is Go
     HAMi's version (Go's v2.10.0 is no tag of this project's image). */}}
{{- define "hami.appTag" -}}
{{- .Chart.AppVersion -}}
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
{{- if $.namesOnly }}
{{- toJson $names }}
{{- else }}
{{- range $names }}
- {name: {{ . }}, ignoredByScheduler: true}
{{- end }}
{{- end }}
{{- end -}}

{{/* hami.yaml as a mapping: what the values say, with .Values.config merged over it. The
     workloads read their ports and paths from it, so an override moves both. */}}
{{- define "hami.configData" -}}
{{- $v := .Values -}}
{{- $policy := $v.scheduler.defaultSchedulerPolicy -}}
{{- $metricsPort := include "hami.metricsPort" . -}}
{{- $cfg := dict
  "log" (dict "format" "json" "level" (include "hami.logLevel" .))
  "node" (dict
    "device_plugin_dir" $v.devicePlugin.pluginPath
    "numa_topology" $v.devicePlugin.enableNumaTopology
    "http" (dict "address" "0.0.0.0" "port" 9394))
  "scheduler" (dict
    "scheduler_name" $v.schedulerName
    "node_lock_timeout" $v.scheduler.nodeLockExpire
    "node_policy" $policy.nodeSchedulerPolicy
    "device_policy" $policy.gpuSchedulerPolicy
    "cluster_metrics" (toString $v.scheduler.clusterMetrics)
    "http" (dict
      "address" (default "0.0.0.0" (trimSuffix (printf ":%s" $metricsPort) (toString $v.scheduler.metricsBindAddress)))
      "port" (atoi $metricsPort))
    "extender" (dict "address" "127.0.0.1" "port" 9396)
    "webhook" (dict
      "enabled" $v.scheduler.admissionWebhook.enabled
      "address" "0.0.0.0"
      "port" 9443
      "tls_mode" (ternary "cert-manager" (ternary "self" "files" $v.scheduler.patch.enabled) $v.scheduler.certManager.enabled)
      "runtime_class_name" $v.devicePlugin.runtimeClassName
      "device_mode" (default $v.devicePlugin.mode $v.scheduler.admissionWebhook.deviceMode)
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
      "register_format" $v.devicePlugin.registerFormat
      "operating_mode" $v.devicePlugin.operatingMode
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
{{- include "hami.nvidiaModeConfig" (dict "values" $v.devicePlugin "nvidia" $cfg.backends.nvidia) -}}
{{- if eq $v.devicePlugin.mode "dra" -}}
{{- range $backend := (list "nvidia" "mlu") -}}
{{- $_ := set (index $cfg.backends $backend) "mode" "dra" -}}
{{- end -}}
{{- $_ := set $cfg.node "dra" (dict
  "plugins_dir" "/var/lib/kubelet/plugins"
  "registry_dir" "/var/lib/kubelet/plugins_registry"
  "cdi_dir" "/var/run/cdi") -}}
{{- $_ := set $cfg.scheduler "dra_score" $v.scheduler.draScore.enabled -}}
{{- end -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy $v.config)) -}}
{{- end -}}

{{/* kube-scheduler's image tag: image.tag, Go HAMi <= 2.6's imageTag, else the cluster's. */}}
{{- define "hami.kubeSchedulerImageTag" -}}
{{- $k := .Values.scheduler.kubeScheduler -}}
{{- coalesce $k.image.tag $k.imageTag (include "hami.kubeSchedulerTag" .) -}}
{{- end -}}

{{/* HAMi-core's source image tag: its own, else Go HAMi's version (global.imageTag). */}}
{{- define "hami.coreTag" -}}
{{- coalesce .Values.devicePlugin.hamiCore.image.tag .Values.global.imageTag "v2.6.1" -}}
{{- end -}}

{{/* The port of scheduler.metricsBindAddress ([host]:port). */}}
{{- define "hami.metricsPort" -}}
{{- last (splitList ":" (toString .Values.scheduler.metricsBindAddress)) -}}
{{- end -}}

{{/* kube-scheduler's arguments after --config: --v=2, or the verbosity extraNewArgs give,
     and the rest of extraNewArgs. One per line. */}}
{{- define "hami.kubeSchedulerArgs" -}}
{{- $verbosity := "--v=2" -}}
{{- $rest := list -}}
{{- range .Values.scheduler.kubeScheduler.extraNewArgs -}}
{{- $arg := toString . -}}
{{- if regexMatch "^--?v[= ]" $arg -}}
{{- $verbosity = printf "--v=%s" (regexReplaceAll "^--?v[= ]" $arg "") -}}
{{- else if eq $arg "--config=/config/config.yaml" -}}
{{- /* Go HAMi's path of the configuration this chart renders itself */ -}}
{{- else if hasPrefix "--config" $arg -}}
{{- fail (printf "scheduler.kubeScheduler.extraNewArgs: %s: kube-scheduler's configuration is the one this chart renders (the extender, the profile, leader election); leave --config out" $arg) -}}
{{- else -}}
{{- $rest = append $rest $arg -}}
{{- end -}}
{{- end -}}
{{- range (prepend $rest $verbosity) }}
{{ . }}
{{- end -}}
{{- end -}}

{{/* hami's log level: logLevel, or debug when Go HAMi's scheduler flag --debug is given. */}}
{{- define "hami.logLevel" -}}
{{- $level := .Values.logLevel -}}
{{- range .Values.scheduler.extender.extraArgs -}}
{{- $arg := toString . -}}
{{- if eq $arg "--debug" "--debug=true" -}}
{{- $level = "debug" -}}
{{- else if not (regexMatch "^--?v(=[0-9]+)?$" $arg) -}}
{{- fail (printf "scheduler.extender.extraArgs: %s: hami's scheduler takes no Go HAMi flags but --debug (logLevel debug) and -v; set its settings under config (config/hami.yaml lists them)" $arg) -}}
{{- end -}}
{{- end -}}
{{- $level -}}
{{- end -}}

{{/* Go HAMi values hami cannot do what they ask for: the install fails with the reason
     (docs/operations.md "Go HAMi's values"). Their defaults pass, so a copied Go HAMi
     values file installs. */}}
{{- define "hami.goValuesCheck" -}}
{{- $v := .Values.AsMap -}}
{{- $refuse := list -}}
{{- $hook := dig "global" "gpuHookPath" "/usr/local" $v -}}
{{- if ne (toString $hook) "/usr/local" -}}
{{- $refuse = append $refuse (printf "global.gpuHookPath %s: HAMi-core lives in /usr/local/vgpu here (backends.nvidia.hamicore under config)" $hook) -}}
{{- end -}}
{{- if dig "global" "managedNodeSelectorEnable" false $v -}}
{{- $refuse = append $refuse "global.managedNodeSelectorEnable: hami's scheduler considers every node; use devicePlugin.nvidiaNodeSelector and the pods' own nodeSelector" -}}
{{- end -}}
{{- $vendors := dict
  "dcuResourceName" "hygon.com/dcunum" "dcuResourceMem" "hygon.com/dcumem" "dcuResourceCores" "hygon.com/dcucores"
  "metaxResourceName" "metax-tech.com/sgpu" "metaxResourceCore" "metax-tech.com/vcore" "metaxResourceMem" "metax-tech.com/vmemory"
  "metaxsGPUTopologyAware" "false"
  "enflameResourceNameDRSGCU" "enflame.com/drs-gcu" "enflameResourceNameGCUMemory" "enflame.com/gcu-memory" "enflameResourceNameGCUCore" "enflame.com/gcu-core"
  "kunlunResourceName" "kunlunxin.com/xpu" "kunlunResourceVCountName" "kunlunxin.com/vxpu" "kunlunResourceVMemoryName" "kunlunxin.com/vxpu-memory"
  "vastaiResourceName" "vastaitech.com/va" "birenResourceName" "birentech.com/gpu" -}}
{{- range $key := keys $vendors | sortAlpha -}}
{{- if and (hasKey $v $key) (ne (toString (index $v $key)) (index $vendors $key)) -}}
{{- $refuse = append $refuse (printf "%s %v: hami has no backend for this vendor (NVIDIA and Cambricon only)" $key (index $v $key)) -}}
{{- end -}}
{{- end -}}
{{- if dig "podSecurityPolicy" "enabled" false $v -}}
{{- $refuse = append $refuse "podSecurityPolicy.enabled: PodSecurityPolicy is gone since Kubernetes 1.25 (this chart needs >= 1.30)" -}}
{{- end -}}
{{- if eq (toString (dig "scheduler" "overwriteEnv" "false" $v)) "true" -}}
{{- $refuse = append $refuse "scheduler.overwriteEnv: hami's webhook does not hide GPUs from containers without a GPU request" -}}
{{- end -}}
{{- if eq (toString (dig "scheduler" "forceOverwriteDefaultScheduler" "true" $v)) "false" -}}
{{- $refuse = append $refuse "scheduler.forceOverwriteDefaultScheduler false: hami's webhook always routes device pods of the default scheduler to hami (a device pod scheduled without hami would use devices hami does not count)" -}}
{{- end -}}
{{- if eq (toString (dig "scheduler" "kubeScheduler" "enabled" true $v)) "false" -}}
{{- $refuse = append $refuse "scheduler.kubeScheduler.enabled false: hami's extender runs only beside its own kube-scheduler" -}}
{{- end -}}
{{- if dig "scheduler" "admissionWebhook" "customURL" "enabled" false $v -}}
{{- $refuse = append $refuse "scheduler.admissionWebhook.customURL.enabled: the API server reaches the webhook through the scheduler's Service (scheduler.service)" -}}
{{- end -}}
{{- if eq (toString (dig "scheduler" "admissionWebhook" "manageNamespaceSelector" true $v)) "false" -}}
{{- $refuse = append $refuse "scheduler.admissionWebhook.manageNamespaceSelector false: the chart must keep kube-system and its own namespace out of the webhook" -}}
{{- end -}}
{{- $svc := .Values.scheduler.service -}}
{{- if ne (toString $svc.monitorTargetPort) (include "hami.metricsPort" .) -}}
{{- $refuse = append $refuse (printf "scheduler.service.monitorTargetPort %v: /metrics listens on scheduler.metricsBindAddress's port %s; change that instead" $svc.monitorTargetPort (include "hami.metricsPort" .)) -}}
{{- end -}}
{{- if ne (toString $svc.httpTargetPort) "443" -}}
{{- $refuse = append $refuse (printf "scheduler.service.httpTargetPort %v: it means the webhook, which listens on scheduler.webhook.port (config) here" $svc.httpTargetPort) -}}
{{- end -}}
{{- $d := .Values.devicePlugin -}}
{{- range $key, $image := dict "scheduler.extender.image" .Values.scheduler.extender.image "devicePlugin.image" $d.image -}}
{{- if hasSuffix "projecthami/hami" (toString $image.repository) -}}
{{- $refuse = append $refuse (printf "%s.repository %s: Go HAMi's image does not run hami; hami's is ghcr.io/hami-py/hami (leave this image's registry and repository out)" $key $image.repository) -}}
{{- end -}}
{{- end -}}
{{- if dig "devicePlugin" "gpuOperatorToolkitReady" "enabled" false $v -}}
{{- $refuse = append $refuse "devicePlugin.gpuOperatorToolkitReady.enabled: the node agent does not wait for the GPU Operator's validations; it retries NVML until the driver is there" -}}
{{- end -}}
{{- $ctr := dig "devicePlugin" "monitor" "ctrPath" "/usr/local/vgpu/containers" $v -}}
{{- if ne (toString $ctr) "/usr/local/vgpu/containers" -}}
{{- $refuse = append $refuse (printf "devicePlugin.monitor.ctrPath %s: HAMi-core's container files are under /usr/local/vgpu/containers here" $ctr) -}}
{{- end -}}
{{- if ne (toString (dig "devicePlugin" "preConfiguredDeviceMemory" 0 $v)) "0" -}}
{{- $refuse = append $refuse "devicePlugin.preConfiguredDeviceMemory: the NVIDIA backend takes device memory from NVML only" -}}
{{- end -}}
{{- $nodeCfg := dig "devicePlugin" "nodeConfiguration" dict $v -}}
{{- if $nodeCfg.externalConfigName -}}
{{- $refuse = append $refuse "devicePlugin.nodeConfiguration.externalConfigName: no per-node configuration here; one config for every node (config)" -}}
{{- end -}}
{{- range (fromJson (default "{}" $nodeCfg.config)).nodeconfig -}}
{{- if ne (toString .name) "your-node-name" -}}
{{- $refuse = append $refuse (printf "devicePlugin.nodeConfiguration.config (node %v): no per-node configuration here; one config for every node (config)" .name) -}}
{{- end -}}
{{- end -}}
{{- if ne (toString $d.migStrategy) "none" -}}
{{- $refuse = append $refuse (printf "devicePlugin.migStrategy %s: NVIDIA's static MIG strategies are not served (none only); hami's MIG is Go HAMi's dynamic mode: devicePlugin.operatingMode mig with devicePlugin.migProfileAllowlist" $d.migStrategy) -}}
{{- end -}}
{{- if eq (toString (dig "devicePlugin" "disablecorelimit" "false" $v)) "true" -}}
{{- $refuse = append $refuse "devicePlugin.disablecorelimit: a container without a core limit asks for none (gpucores absent) here" -}}
{{- end -}}
{{- $nvidiaPlugin := dict "passDeviceSpecsEnabled" false "deviceListStrategy" "envvar" "nvidiaHookPath" nil "nvidiaDriverRoot" nil "gdrcopyEnabled" nil "gdsEnabled" nil "mofedEnabled" nil "hostNetwork" false -}}
{{- range $key := keys $nvidiaPlugin | sortAlpha -}}
{{- $given := dig "devicePlugin" $key (index $nvidiaPlugin $key) $v -}}
{{- if ne (toString $given) (toString (index $nvidiaPlugin $key)) -}}
{{- $refuse = append $refuse (printf "devicePlugin.%s %v: an option of NVIDIA's device plugin, which hami's node agent is not: its Allocate answer sets NVIDIA_VISIBLE_DEVICES and HAMi-core's mounts only" $key $given) -}}
{{- end -}}
{{- end -}}
{{- range (dig "devicePlugin" "extraArgs" list $v) -}}
{{- if not (regexMatch "^--?v(=[0-9]+)?$" (toString .)) -}}
{{- $refuse = append $refuse (printf "devicePlugin.extraArgs %s: the node agent takes no Go HAMi flags but -v; its settings go under config" .) -}}
{{- end -}}
{{- end -}}
{{- $lib := dig "devicePlugin" "libPath" "/usr/local/vgpu" $v -}}
{{- if ne (toString $lib) "/usr/local/vgpu" -}}
{{- $refuse = append $refuse (printf "devicePlugin.libPath %s: HAMi-core lives in /usr/local/vgpu here" $lib) -}}
{{- end -}}
{{- if dig "mockDevicePlugin" "enabled" false $v -}}
{{- $refuse = append $refuse "mockDevicePlugin.enabled: use the fake backend (config.backends.fake) for nodes without GPUs" -}}
{{- end -}}
{{- range $vendor := list "ascend" "iluvatar" -}}
{{- if dig "devices" $vendor "enabled" false $v -}}
{{- $refuse = append $refuse (printf "devices.%s.enabled: hami has no backend for this vendor (NVIDIA and Cambricon only)" $vendor) -}}
{{- end -}}
{{- end -}}
{{- $shipped := dict
  "amd" (list "amd.com/gpu" "amd.com/gpumem" "amd.com/gpucores")
  "awsneuron" (list "aws.amazon.com/neuron" "aws.amazon.com/neuroncore")
  "kunlun" (list "kunlunxin.com/xpu" "kunlunxin.com/vxpu" "kunlunxin.com/vxpu-memory")
  "enflame" (list "enflame.com/drs-gcu" "enflame.com/gcu-memory" "enflame.com/gcu-core" "enflame.com/gcu")
  "mthreads" (list "mthreads.com/vgpu") "vastai" (list "vastaitech.com/va") "biren" (list "birentech.com/gpu") -}}
{{- range $vendor := keys $shipped | sortAlpha -}}
{{- range (dig "devices" $vendor "customresources" list $v) -}}
{{- if not (has (toString .) (index $shipped $vendor)) -}}
{{- $refuse = append $refuse (printf "devices.%s.customresources %s: hami has no backend for this vendor; its resources are not routed to hami" $vendor .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $policy := dig "devices" "nvidia" "gpuCorePolicy" "default" $v -}}
{{- if ne (toString $policy) "default" -}}
{{- $refuse = append $refuse (printf "devices.nvidia.gpuCorePolicy %s: the core limit follows each pod's gpucores here (default only)" $policy) -}}
{{- end -}}
{{- $cudaLog := dig "devices" "nvidia" "libCudaLogLevel" 1 $v -}}
{{- if ne (toString $cudaLog) "1" -}}
{{- $refuse = append $refuse (printf "devices.nvidia.libCudaLogLevel %v: the node agent sets no LIBCUDA_LOG_LEVEL (1 only)" $cudaLog) -}}
{{- end -}}
{{- if dig "legacyMetrics" false $v -}}
{{- $refuse = append $refuse "legacyMetrics: hami exports Go HAMi's current metric names only" -}}
{{- end -}}
{{- if dig "device-config" "content" "" $v -}}
{{- $refuse = append $refuse "device-config.content: hami has no device-config.yaml; its settings go under config (config/hami.yaml)" -}}
{{- end -}}
{{- if $refuse -}}
{{- fail (printf "Go HAMi values hami cannot honour (docs/operations.md, \"Go HAMi's values\"):\n- %s" (join "\n- " $refuse)) -}}
{{- end -}}
{{- end -}}
