"""kubelet plugin registration API v1 (k8s.io/kubelet v0.36.2, api.proto copied unchanged).

`api_pb2` holds the messages, `api_grpc` the grpclib service and stub
(`RegistrationBase`/`RegistrationStub`; gRPC service `pluginregistration.Registration`).
A plugin serves it on a socket in /var/lib/kubelet/plugins_registry; kubelet calls GetInfo.
"""
