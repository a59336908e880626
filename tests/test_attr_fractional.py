"""HAMi and gpushare annotations parsed into fractional grants; bad input gives errors, never
an exception."""

import pytest

from exporter.attribution.fractional import FractionalGrant, ParsedGrants, parse_grants

U0, U1 = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "GPU-1fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
HAMI = "hami.io/vgpu-devices-allocated"


def test_hami_groups_follow_the_spec_containers() -> None:
    parsed = parse_grants({HAMI: f"{U0},NVIDIA,3000,30:;;{U1},NVIDIA,1024,0:{U0},NVIDIA,512,5:;"},
                          ("a", "b", "c"))
    assert parsed == ParsedGrants((
        FractionalGrant("a", U0, "nvidia.com/gpumem", memory_bytes=3000 << 20, core_fraction=0.3),
        FractionalGrant("c", U1, "nvidia.com/gpumem", memory_bytes=1024 << 20),
        FractionalGrant("c", U0, "nvidia.com/gpumem", memory_bytes=512 << 20,
                        core_fraction=0.05)))


def test_gpushare() -> None:
    parsed = parse_grants({"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4",
                           "ALIYUN_COM_GPU_MEM_DEV": "16"}, ("main",))
    assert parsed == ParsedGrants((FractionalGrant("", "1", "aliyun.com/gpu-mem",
                                                   memory_fraction=0.25),))


def test_no_annotations_no_grants() -> None:
    assert parse_grants({}, ("main",)) == ParsedGrants()
    assert parse_grants({HAMI: ";"}, ("main",)) == ParsedGrants()  # to-allocate emptied


@pytest.mark.parametrize("annotations", [
    {HAMI: f"{U0},NVIDIA,3000:;"},
    {HAMI: f"{U0},NVIDIA,-3,30:;"},
    {HAMI: f"{U0},NVIDIA,3000,130:;"},
    {HAMI: ",NVIDIA,3000,30:;"},
    {HAMI: f"{U0},NVIDIA,3000,30:;{U0},NVIDIA,3000,30:;"},  # two groups, one container
    {HAMI: "🙂" * 500},
    {"ALIYUN_COM_GPU_MEM_IDX": "x", "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_DEV": "16"},
    {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"},
    {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_DEV": "0"},
    {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "17",
     "ALIYUN_COM_GPU_MEM_DEV": "16"},
])
def test_malformed_gives_one_error_and_no_grant(annotations: dict[str, str]) -> None:
    parsed = parse_grants(annotations, ("main",))
    assert len(parsed.errors) >= 1 and all(len(e) < 300 for e in parsed.errors)
    assert all(g.container == "main" for g in parsed.grants)
    assert len(parsed.grants) <= 1
