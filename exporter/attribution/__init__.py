"""Pod attribution: which pod and container holds each GPU and runs each GPU process.

Sources: the kubelet PodResources API (device allocations), /proc/<pid>/cgroup (process ->
pod UID, container ID) and a node-scoped watch of pods (UID -> namespace, name, labels).
"""
