"""`gpu-ledger <command>`: dispatch only. Each command lives in the package that owns it and
is imported lazily, so the exporter image never loads DuckDB and metering never loads NVML."""

from __future__ import annotations

import importlib
import sys

# command -> (module, one-line help). Each module exposes main(argv: list[str]) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "exporter": ("exporter.cli", "run the node exporter (NVML + pod attribution) for Prometheus"),
    "meter": ("metering.cli_meter", "pull hourly GPU usage from Prometheus into DuckDB, price it"
              " (--daily: the operating mode)"),
    "close": ("metering.cli_close", "close a metered month: later data becomes adjustments"),
    "report": ("metering.report.cli", "write the monthly chargeback report"),
    "cost-model": ("metering.cli_costmodel", "check or show a cost model file"),
    "ledger": ("metering.cli_ledger", "export a ledger as Parquet, or merge per-cluster ledgers"),
    "demo": ("gpu_ledger.demo", "run the whole pipeline on a simulated cluster"),
    "doctor": ("gpu_ledger.doctor", "check a node's NVML, driver, MIG, kubelet socket, cgroups"),
}


def usage() -> str:
    lines = ["usage: gpu-ledger <command> [options]", "", "commands:"]
    lines += [f"  {name:<11} {help}" for name, (_, help) in COMMANDS.items()]
    lines += ["", "Run `gpu-ledger <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        from exporter import __version__

        print(f"gpu-ledger {__version__}")
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"gpu-ledger: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    rc: int = module.main(args[1:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
