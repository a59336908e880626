"""Refresh the vendored Prometheus Operator schemas the deploy tests validate against.

`python deploy/schemas/refresh.py` (or `make refresh-crd-schemas`) downloads the CRDs of the
release in VERSION from GitHub and keeps only the `v1` openAPIV3Schema of each, as JSON;
`--from DIR` reads a checkout's example/prometheus-operator-crd/ instead (no network).
The schemas are the Prometheus Operator's (Apache-2.0, LICENSE next to them).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
VERSION = "v0.93.0"
URL = ("https://raw.githubusercontent.com/prometheus-operator/prometheus-operator/"
       "{version}/example/prometheus-operator-crd/{name}")
# CRD file -> the vendored schema file
CRDS = {
    "monitoring.coreos.com_servicemonitors.yaml": "servicemonitor-v1.json",
    "monitoring.coreos.com_prometheusrules.yaml": "prometheusrule-v1.json",
}


def v1_schema(crd_text: str) -> dict[str, Any]:
    crd = yaml.safe_load(crd_text)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python deploy/schemas/refresh.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path,
                        help="a prometheus-operator checkout instead of GitHub")
    args = parser.parse_args(argv)
    for crd_name, out in CRDS.items():
        if args.source is not None:
            text = (args.source / "example/prometheus-operator-crd" / crd_name).read_text()
        else:
            url = URL.format(version=VERSION, name=crd_name)
            with urllib.request.urlopen(url, timeout=60) as resp:
                text = resp.read().decode()
        schema = {"$comment": f"prometheus-operator {VERSION} {crd_name} (v1 openAPIV3Schema); "
                  "refreshed by deploy/schemas/refresh.py", **v1_schema(text)}
        (HERE / out).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"wrote {HERE / out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
