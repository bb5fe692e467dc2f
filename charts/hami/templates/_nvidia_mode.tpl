{{/* The NVIDIA operating mode (devicePlugin.operatingMode; docs/node.md "MIG GPUs", "MPS"):
     its settings in hami.yaml, the checks the node agent would otherwise fail at start,
     and what the agent's container needs on the node in that mode. */}}

{{/* Adds the mode's own settings to backends.nvidia (dict "values" devicePlugin "nvidia"
     the nvidia section): the allow-list in mig mode, the daemon's paths in mps mode. */}}
{{- define "hami.nvidiaModeConfig" -}}
{{- $d := .values -}}
{{- if eq $d.operatingMode "mig" -}}
{{- $_ := set .nvidia "mig_profile_allowlist" $d.migProfileAllowlist -}}
{{- else if eq $d.operatingMode "mps" -}}
{{- $_ := set .nvidia "mps" (dict
  "pipe_dir" $d.mps.pipeDir
  "log_dir" $d.mps.logDir
  "shm_dir" $d.mps.shmDir
  "daemon" $d.mps.daemon) -}}
{{- end -}}
{{- end -}}

{{/* Fails the install with the fix when the rendered nvidia section (values and `config`
     merged) asks for a mode the agent would refuse to start in. */}}
{{- define "hami.nvidiaModeCheck" -}}
{{- $nv := .backends.nvidia -}}
{{- $mode := $nv.operating_mode | default "hami-core" -}}
{{- if and (has $mode (list "mig" "mps")) (ne ($nv.register_format | default "seed") "json") -}}
{{- fail (printf "devicePlugin.operatingMode %s needs devicePlugin.registerFormat json: the register value's mode (and MIG profiles) travel only in the JSON form" $mode) -}}
{{- end -}}
{{- if and (eq $mode "mig") (not $nv.mig_profile_allowlist) -}}
{{- fail "devicePlugin.operatingMode mig needs devicePlugin.migProfileAllowlist: the profiles each GPU model offers, e.g. [{models: [A100-SXM4-40GB], profiles: [1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb]}]" -}}
{{- end -}}
{{- end -}}

{{/* The agent container's extra environment in this mode (list items, or nothing). */}}
{{- define "hami.nvidiaModeEnv" -}}
{{- $mode := .operating_mode | default "hami-core" -}}
{{- if eq $mode "mig" }}
# NVIDIA's container runtime gives the container the mig-config and mig-monitor
# capabilities (needs CAP_SYS_ADMIN, below): the agent makes and destroys instances
- {name: NVIDIA_MIG_CONFIG_DEVICES, value: all}
- {name: NVIDIA_MIG_MONITOR_DEVICES, value: all}
{{- end }}
{{- end -}}

{{/* NVIDIA_DRIVER_CAPABILITIES of the agent: mps also needs compute (the runtime then
     mounts nvidia-cuda-mps-control and -server). */}}
{{- define "hami.nvidiaDriverCapabilities" -}}
{{- if eq (.operating_mode | default "hami-core") "mps" -}}compute,utility{{- else -}}utility{{- end -}}
{{- end -}}

{{/* The agent container's extra mounts in mps mode: the daemon's directories at the same
     path as on the host, and the shared tmpfs as its /dev/shm. */}}
{{- define "hami.nvidiaModeMounts" -}}
{{- if eq (.operating_mode | default "hami-core") "mps" -}}
{{- $mps := .mps | default dict }}
- {name: mps-pipe, mountPath: {{ $mps.pipe_dir | default "/run/nvidia/mps/pipe" }}}
- {name: mps-log, mountPath: {{ $mps.log_dir | default "/run/nvidia/mps/log" }}}
{{- with $mps.shm_dir }}
- {name: mps-shm, mountPath: /dev/shm}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The host volumes of those mounts. */}}
{{- define "hami.nvidiaModeVolumes" -}}
{{- if eq (.operating_mode | default "hami-core") "mps" -}}
{{- $mps := .mps | default dict }}
- {name: mps-pipe, hostPath: {path: {{ $mps.pipe_dir | default "/run/nvidia/mps/pipe" }}, type: DirectoryOrCreate}}
- {name: mps-log, hostPath: {path: {{ $mps.log_dir | default "/run/nvidia/mps/log" }}, type: DirectoryOrCreate}}
{{- with $mps.shm_dir }}
- {name: mps-shm, hostPath: {path: {{ . }}, type: Directory}}
{{- end }}
{{- end -}}
{{- end -}}
