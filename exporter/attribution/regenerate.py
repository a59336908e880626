"""Regenerate the committed PodResources stubs: `python -m exporter.attribution.regenerate`.

protoc emits `import podresources_pb2`, which only works with this directory on sys.path; the
stubs are rewritten to import through the package. `--check` exits 1 when the committed
descriptor differs from the .proto instead of writing anything.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "podresources.proto"
PACKAGE = "exporter.attribution"
OUTPUTS = ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_pb2_grpc.py")

_BARE_IMPORT = re.compile(r"^import podresources_pb2 as ", re.MULTILINE)
# Generated code follows protoc's style, not ours: keep linters and strict typing off it.
_HEADER = "# ruff: noqa\n# mypy: ignore-errors\n"


def _protoc(args: list[str]) -> None:
    # build-time only: grpcio-tools is a dev dependency
    from grpc_tools import protoc  # type: ignore[import-untyped]

    rc = protoc.main(["protoc", f"-I{HERE}", *args, str(PROTO)])
    if rc != 0:
        raise RuntimeError(f"{PROTO}: protoc exited {rc}")


def compile_descriptor() -> bytes:
    """The FileDescriptorProto protoc builds from the .proto now (serialized)."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        _protoc([f"--descriptor_set_out={out}"])
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = fds.file
    return fd.SerializeToString(deterministic=True)


def generate(dest: Path = HERE) -> list[Path]:
    """Run protoc into a scratch dir, fix the import, then move the files into `dest`."""
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        _protoc([f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"])
        for name in OUTPUTS:
            text = (Path(tmp) / name).read_text()
            text = _HEADER + _BARE_IMPORT.sub(f"from {PACKAGE} import podresources_pb2 as ", text)
            target = dest / name
            target.write_text(text)
            written.append(target)
    return written


def _normalized(raw: bytes) -> bytes:
    """Parse and re-serialize deterministically, without json_name: the Python generator drops
    it from the embedded descriptor while --descriptor_set_out keeps it."""
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
    fd.ClearField("source_code_info")
    messages = list(fd.message_type)
    while messages:
        msg = messages.pop()
        messages.extend(msg.nested_type)
        for f in (*msg.field, *msg.extension):
            f.ClearField("json_name")
    return fd.SerializeToString(deterministic=True)


def is_current() -> bool:
    """True when the committed module embeds the descriptor the .proto compiles to."""
    from exporter.attribution import podresources_pb2

    return _normalized(podresources_pb2.DESCRIPTOR.serialized_pb) == _normalized(
        compile_descriptor())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        if is_current():
            print("podresources stubs are current")
            return 0
        print(f"podresources stubs are stale: run python -m {PACKAGE}.regenerate",
              file=sys.stderr)
        return 1
    if args:
        print("usage: python -m exporter.attribution.regenerate [--check]", file=sys.stderr)
        return 2
    for path in generate():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
