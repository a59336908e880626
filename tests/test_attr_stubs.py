"""The committed PodResources stubs match podresources.proto, and import as a package."""

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from exporter.attribution import podresources_pb2, podresources_pb2_grpc, regenerate


def test_committed_descriptor_matches_the_proto() -> None:
    # Compares descriptors, not text: protoc versions format the generated files differently.
    assert regenerate.is_current(), "run: python -m exporter.attribution.regenerate"


def test_fresh_descriptor_has_the_kubelet_wire_format() -> None:
    fd = descriptor_pb2.FileDescriptorProto.FromString(regenerate.compile_descriptor())
    assert fd.package == "v1"
    (service,) = fd.service
    assert service.name == "PodResourcesLister"
    assert [(m.name, m.input_type, m.output_type) for m in service.method] == [
        ("List", ".v1.ListPodResourcesRequest", ".v1.ListPodResourcesResponse"),
        ("GetAllocatableResources", ".v1.AllocatableResourcesRequest",
         ".v1.AllocatableResourcesResponse"),
        ("Get", ".v1.GetPodResourcesRequest", ".v1.GetPodResourcesResponse"),
    ]
    fields = {m.name: {f.name: f.number for f in m.field} for m in fd.message_type}
    assert fields["ContainerResources"] == {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4,
                                            "dynamic_resources": 5}
    assert fields["ContainerDevices"] == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert fields["DynamicResource"] == {"claim_name": 2, "claim_namespace": 3,
                                         "claim_resources": 4}
    assert fields["ClaimResource"] == {"cdi_devices": 1, "driver_name": 2, "pool_name": 3,
                                       "device_name": 4}


def test_a_changed_proto_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proto = tmp_path / "podresources.proto"
    proto.write_text(regenerate.PROTO.read_text().replace("string pool_name = 3;",
                                                          "string pool_name = 7;"))
    monkeypatch.setattr(regenerate, "PROTO", proto)
    monkeypatch.setattr(regenerate, "HERE", tmp_path)
    assert not regenerate.is_current()


def test_generated_grpc_module_imports_through_the_package() -> None:
    assert vars(podresources_pb2_grpc)["podresources__pb2"] is podresources_pb2
    text = regenerate.HERE.joinpath("podresources_pb2_grpc.py").read_text()
    assert not [line for line in text.splitlines() if line.startswith("import podresources")]


def test_regenerate_writes_identical_descriptors(tmp_path: Path) -> None:
    written = regenerate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(regenerate.OUTPUTS)
    text = (tmp_path / "podresources_pb2_grpc.py").read_text()
    assert "from exporter.attribution import podresources_pb2 as podresources__pb2" in text
