"""kubelet DRA plugin API (k8s.io/kubelet v0.36.2 pkg/apis/dra)."""
