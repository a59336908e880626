"""A simulated GPU node for tests, benchmarks and the demo (never the product: the image has no
gpusim). A scenario YAML (gpusim.scenario) drives a pynvml-compatible module (gpusim.nvml) and
the Kubernetes view of the same node (gpusim.node: device plugin IDs, pods, /proc cgroup files;
gpusim.kubelet, gpusim.apiserver: a real PodResources server and pods API; gpusim.cluster: whole
simulated nodes running the exporter's sampler). AMD and Intel nodes have scenarios of their own
(gpusim.vendor_scenario) over the simulated amdsmi, Intel sysfs and Level Zero
(gpusim.vendor_node). Imports stay in the modules, so loading one part does not load the rest."""
