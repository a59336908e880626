"""A small Kubernetes API client on the standard library: credentials (in-cluster service account
or a kubeconfig), JSON GETs and watch streams over http.client, and a node-scoped list+watch
with backoff. The official `kubernetes` package costs ~34 MiB of RSS to import (486 modules);
the exporter needs two GET shapes of it (see docs/performance.md, "Memory")."""
