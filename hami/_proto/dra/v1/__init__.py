"""kubelet DRA plugin API v1 (k8s.io/kubelet v0.36.2, api.proto copied unchanged).

`api_pb2` holds the messages, `api_grpc` the grpclib service and stub
(`DRAPluginBase`/`DRAPluginStub`; gRPC service `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
"""
