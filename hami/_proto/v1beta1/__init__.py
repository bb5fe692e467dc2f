"""kubelet device plugin API v1beta1 (k8s.io/kubelet v0.36.2, api.proto copied unchanged).

`api_pb2` holds the messages, `api_grpc` the grpclib services and stubs
(`RegistrationBase`/`RegistrationStub`, `DevicePluginBase`/`DevicePluginStub`).
"""
