"""kubelet plugin watcher registration API (k8s.io/kubelet v0.36.2 pkg/apis/pluginregistration)."""
