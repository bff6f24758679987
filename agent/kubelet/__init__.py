"""Vendored kubelet APIs (Apache-2.0, The Kubernetes Authors) with their generated Python stubs.

``podresources/v1/api.proto`` is ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` unchanged
but for the header comment; ``tests/agent/test_podresources.py`` fails when the committed stubs
differ from what this regenerates (run from the repository root)::

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \\
        agent/kubelet/podresources/v1/api.proto
"""
