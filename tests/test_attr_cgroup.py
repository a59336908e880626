"""/proc/<pid>/cgroup → pod UID and container ID, over fixture proc trees for each pattern."""

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.cgroup import CgroupRef, CgroupResolver, parse_cgroup

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup" / "proc"


def uid(n: int) -> str:
    return f"{n:08x}-1111-2222-3333-{n:012x}"


def cid(n: int) -> str:
    return f"{n:02x}" * 32


# pid → what its fixture cgroup file must give; the comment names the pattern
EXPECTED = {
    1001: CgroupRef(uid(1), cid(1)),  # v2 systemd, containerd, Burstable
    1002: CgroupRef(uid(2), cid(2)),  # v2 systemd, containerd, Guaranteed
    1003: CgroupRef(uid(3), cid(3)),  # v2 systemd, CRI-O crio-<id>.scope, BestEffort
    1004: CgroupRef(uid(4), ""),  # CRI-O crio-conmon-<id>.scope: the monitor, not the container
    1005: CgroupRef(uid(5), cid(5)),  # v2 cgroupfs, containerd /<64hex>, Burstable
    1006: CgroupRef(uid(6), cid(6)),  # v2 cgroupfs, Guaranteed
    1007: CgroupRef(uid(7), cid(7)),  # cgroupfs, CRI-O crio-<id>, BestEffort
    1008: CgroupRef(uid(8), cid(8)),  # v1 cgroupfs, docker, many controllers, v2 line at /
    1009: CgroupRef(uid(9), cid(9)),  # v1 systemd, docker-<id>.scope
    1010: CgroupRef(uid(10), cid(10)),  # cgroup namespace: /../../kubepods-...
    1011: CgroupRef(uid(11), cid(11)),  # v1, only the memory hierarchy names the pod
    1012: None,  # a host service
    1013: CgroupRef(uid(13), cid(13)),  # nested cgroup below the container's
    1014: CgroupRef("ab" * 16, cid(14)),  # static pod: UID is a 32-hex config hash
    1015: CgroupRef(uid(15), cid(15)),  # namespace-relative cgroupfs /../pod<uid>/<id>
    1016: CgroupRef(uid(16), cid(16)),  # kind: a node container above the pod is ignored
}


def test_fixture_tree_covers_every_case() -> None:
    assert sorted(int(p.name) for p in FIXTURES.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("pid", sorted(EXPECTED))
def test_fixture(pid: int) -> None:
    assert parse_cgroup((FIXTURES / str(pid) / "cgroup").read_text()) == EXPECTED[pid]


def test_resolver_reads_a_proc_root() -> None:
    assert CgroupResolver(str(FIXTURES)).resolve(sorted(EXPECTED)) == EXPECTED


def test_docker_outside_kubernetes_gives_only_the_container() -> None:
    text = f"0::/system.slice/docker-{cid(3)}.scope\n"
    assert parse_cgroup(text) == CgroupRef("", cid(3))


def test_upper_case_and_garbage_lines() -> None:
    text = f"garbage\n\n0::/kubepods/burstable/pod{uid(5).upper()}/{cid(5).upper()}\n"
    assert parse_cgroup(text) == CgroupRef(uid(5), cid(5))


def test_cache_lives_while_the_pid_is_listed(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES, root)
    resolver = CgroupResolver(str(root))
    assert resolver.resolve([1001, 1005])[1001] == EXPECTED[1001]
    # while listed, the cached answer stands (the file is not read again)
    (root / "1001" / "cgroup").write_text(f"0::/kubepods/pod{uid(99)}/{cid(99)}\n")
    assert resolver.resolve([1001])[1001] == EXPECTED[1001]
    # once it leaves NVML's list the pid is forgotten: a reused pid is read afresh
    resolver.resolve([1005])
    assert resolver.resolve([1001])[1001] == CgroupRef(uid(99), cid(99))


def test_unreadable_pid_is_retried(tmp_path: Path) -> None:
    resolver = CgroupResolver(str(tmp_path))
    assert resolver.resolve([77]) == {77: None}
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(f"0::/kubepods/pod{uid(7)}/{cid(7)}\n")
    assert resolver.resolve([77]) == {77: CgroupRef(uid(7), cid(7))}


_segments = st.sampled_from([
    "kubepods", "kubepods.slice", "kubepods-burstable.slice", "burstable", "besteffort", "..",
    f"pod{uid(1)}", f"kubepods-pod{uid(2).replace('-', '_')}.slice", f"pod{'c' * 32}",
    cid(1), f"cri-containerd-{cid(2)}.scope", f"crio-{cid(3)}", f"crio-conmon-{cid(4)}.scope",
    f"docker-{cid(5)}.scope", "init.scope", "", "pod", "pod-", "crio-", "-pod_",
]) | st.text(max_size=20)


@given(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=12),
                          st.lists(_segments, max_size=8)), max_size=6))
def test_no_text_makes_the_parser_raise(lines: list[tuple[str, str, list[str]]]) -> None:
    text = "\n".join(f"{h}:{c}:" + "/".join(segs) for h, c, segs in lines)
    ref = parse_cgroup(text)
    assert ref is None or isinstance(ref, CgroupRef)


@given(st.text())
def test_no_arbitrary_text_makes_the_parser_raise(text: str) -> None:
    parse_cgroup(text)
