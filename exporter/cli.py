"""`gpu-ledger exporter`: flags, wiring and signal handling for the node exporter."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from exporter import __version__
from exporter.collectors import REGISTRY
from exporter.core import CollectorSpec, ExporterOptions
from exporter.errors import ConfigError
from gpu_ledger.sharing import DECLARABLE, SharingMode

# 9400 is dcgm-exporter's and 9835 nvidia_gpu_exporter's; 9847 is free of both.
DEFAULT_LISTEN = ":9847"
log = logging.getLogger("gpu_ledger.exporter")

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(text: str) -> float:
    """'5', '5s', '500ms', '1m' -> seconds; argparse turns a ValueError into a usage error."""
    raw = text.strip()
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if raw.endswith(suffix):
            value = float(raw[: -len(suffix)]) * _UNITS[suffix]
            break
    else:
        value = float(raw)
    if value <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return value


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected [HOST]:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-ledger exporter",
        description="Serve NVML GPU metrics, attributed to Kubernetes pods, to Prometheus.")
    p.add_argument("--nvml", default="real",
                   help="'real' (pynvml, the default) or 'sim:SCENARIO.yaml' for a simulated node")
    p.add_argument("--amdsmi", default="real",
                   help="AMD GPUs: 'real' (the amdsmi package, the default) or 'sim:NAME' "
                        "(mi300x-cpx-nps4, mxgpu-host) for a simulated AMD node")
    p.add_argument("--device-backend", default="auto",
                   help="which GPUs to read: 'auto' (every vendor library or sysfs that answers, "
                        "the default), or a comma list of nvml, amd, intel")
    p.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN,
                   help=f"[host]:port to listen on (default {DEFAULT_LISTEN})")
    p.add_argument("--web.config.file", dest="web_config", default=None,
                   help="TLS / basic auth config in the Prometheus exporter-toolkit format")
    p.add_argument("--interval", type=parse_seconds, default=5.0,
                   help="how often to sample NVML and the kubelet (default 5s)")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="this node's name (default: $NODE_NAME, else the hostname); it also "
                        "names GPUs without a chip-derived ID (uuid <PCI address>@<node>)")
    p.add_argument("--process-metrics", action="store_true",
                   help="also emit per-process series (pid labels churn: off by default)")
    p.add_argument("--pod-resources-socket",
                   default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="kubelet PodResources API socket")
    p.add_argument("--proc-root", default="/proc", help="where /proc/<pid>/cgroup is read")
    p.add_argument("--sysfs-root", default="/sys",
                   help="where the PCI devices are read to count the node's NVIDIA GPUs "
                        "without NVML (gpu_expected_devices; default /sys)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig for the pod watch (default: $KUBECONFIG, else the in-cluster "
                        "service account, else ~/.kube/config)")
    p.add_argument("--no-kubernetes", action="store_true",
                   help="do not watch pods through the Kubernetes API")
    p.add_argument("--pod-labels", default="team",
                   help="comma-separated pod labels copied onto gpu_container_* as label_<name> "
                        "(default: team)")
    p.add_argument("--sharing-mode", action="append", default=[], metavar="RESOURCE=MODE",
                   help=f"sharing mode of a resource name ({'|'.join(DECLARABLE)}), "
                        "e.g. nvidia.com/gpu.shared=mps; for a DRA driver "
                        "(gpu.nvidia.com=mps) it wins over the shared claims' own config; "
                        "repeatable")
    p.add_argument("--rpc-timeout", type=parse_seconds, default=2.0,
                   help="deadline of each kubelet call (default 2s)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=f"gpu-ledger {__version__}")
    group = p.add_argument_group(
        "collectors", "each collector is switched on with --collector.NAME and off with "
        "--no-collector.NAME")
    for spec in REGISTRY:
        state = "on" if spec.default_enabled else "off"
        group.add_argument(f"--collector.{spec.name}", dest=f"collector_{spec.name}",
                           action=argparse.BooleanOptionalAction, default=None,
                           help=f"{spec.help} (default {state})")
    return p


def enabled_specs(args: argparse.Namespace) -> list[CollectorSpec]:
    out = []
    for spec in REGISTRY:
        flag = getattr(args, f"collector_{spec.name}")
        if spec.default_enabled if flag is None else flag:
            out.append(spec)
    return out


def options_from(args: argparse.Namespace) -> ExporterOptions:
    modes = []
    declarable = "|".join(DECLARABLE)
    for item in args.sharing_mode:
        resource, sep, mode = item.partition("=")
        if not sep or mode not in DECLARABLE:
            raise ValueError(f"--sharing-mode: expected RESOURCE={declarable}, got {item!r}")
        modes.append((resource, SharingMode(mode)))
    return ExporterOptions(
        node=args.node_name, interval=args.interval, process_metrics=args.process_metrics,
        pod_resources_socket=args.pod_resources_socket, proc_root=args.proc_root,
        sysfs_root=args.sysfs_root,
        kubeconfig=args.kubeconfig, kubernetes=not args.no_kubernetes,
        pod_label_allowlist=tuple(sorted({x.strip() for x in args.pod_labels.split(",")
                                          if x.strip()})),
        sharing_modes=tuple(modes), rpc_timeout=args.rpc_timeout,
    )


def node_name_notice(node: str, argv: list[str]) -> str | None:
    """One line when the node name is not the Kubernetes node's: it names the GPUs that have
    no chip-derived UUID (`<PCI address>@<node>`, exporter/device/identity.py)."""
    if not node:
        return ("no node name (--node-name is empty): AMD and Intel GPUs without a "
                "chip-derived UUID are published under their bare PCI address, which metering "
                "refuses when two nodes report it")
    given = any(a == "--node-name" or a.startswith("--node-name=") for a in argv)
    if not given and not os.environ.get("NODE_NAME"):
        return (f"NODE_NAME is not set: the node name is the hostname {node!r}, which also "
                "names GPUs without a chip-derived UUID (<PCI address>@<node>); set NODE_NAME "
                "from spec.nodeName so they keep their name when the pod is replaced")
    return None


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from exporter.device.registry import LoadSpec, load_backends
    from exporter.sampler import Sampler
    from exporter.web import start_server
    from exporter.webconfig import load_web_config

    try:
        host, port = parse_listen(args.listen)
        options = options_from(args)
        web_config = load_web_config(args.web_config) if args.web_config else None
        notice = node_name_notice(options.node, argv)
        if notice:
            logging.getLogger("exporter").warning("%s", notice)
        backend = load_backends(args.device_backend, LoadSpec(
            nvml=args.nvml, amdsmi=args.amdsmi, sysfs_root=options.sysfs_root,
            proc_root=options.proc_root, node=options.node))
    except (ConfigError, ValueError, OSError) as err:
        print(f"gpu-ledger exporter: {err}", file=sys.stderr)
        return 1
    sampler = Sampler(backend, options, enabled_specs(args))
    sampler.cycle()  # the first scrape already has data
    sampler.start()
    try:
        server = start_server(sampler, host, port, web_config)
    except OSError as err:
        print(f"gpu-ledger exporter: {err}", file=sys.stderr)
        sampler.close()
        return 1
    log.info("serving metrics on %s/metrics (node %s, interval %.1fs)", server.url.rstrip("/"),
             options.node, options.interval)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("shutting down")
    server.shutdown()
    sampler.close()
    return 0
