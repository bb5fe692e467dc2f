"""``scripts/gpu-check.sh`` step 5 (hami.testkit.gpucheck_mig): the MIG capability the NVIDIA
backend reads against ``nvidia-smi mig -lgip`` / ``-lgipp``, reading only.

The nvidia-smi texts are NVIDIA's MIG user guide's A100-SXM4-40GB examples ("Getting Started
with MIG": listing GPU instance profiles and their possible placements). They were checked
line for line against copies of the guide's output published in public repositories (the
same table layout, profile ids, placements and memory column); no real MIG GPU was at hand
to record them, and the memory column differs by driver (9.62 or 9.75 GiB for 1g.10gb), so
the parsers are written to the columns, not to exact spacing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from _nvml_helpers import FakeGpu, FakeNvml

from hami.protocol.mig import MigPlacement
from hami.testkit import gpucheck_mig
from hami.testkit.gpucheck_mig import parse_lgip, parse_lgipp, parse_mig_modes
from hami.testkit.gpucheck_run import Ran, Runner

LGIP_A100_40GB = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.5gb+me     20     1/1        4.75       No     14     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb       15     4/4        9.62       No     14     1     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.10gb       14     3/3        9.62       No     28     1     0   |
|                                                             2     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.20gb        9     2/2        19.50      No     42     2     0   |
|                                                             3     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 4g.20gb        5     1/1        19.50      No     56     2     0   |
|                                                             4     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.40gb        0     1/1        39.25      No     98     5     0   |
|                                                             7     1     1   |
+-----------------------------------------------------------------------------+
"""

LGIPP_A100_40GB = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""


def runner(answers: Mapping[tuple[str, ...], str], ran: list[tuple[str, ...]]) -> Runner:
    def run(
        argv: Sequence[str],
        *,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Ran:
        args = tuple(argv)
        ran.append(args)
        if args not in answers:
            return Ran(args, 2, "", f"unexpected: {' '.join(args)}")
        return Ran(args, 0, answers[args], "")

    return run


def a100(mig_mode: int | None = 1) -> FakeNvml:
    gpu = FakeGpu(0, "GPU-a", "NVIDIA A100-SXM4-40GB", 40 << 30, "00000000:07:00.0")
    gpu.mig_mode = mig_mode
    return FakeNvml([gpu])


def answers(
    lgipp: str = LGIPP_A100_40GB, modes: str = "0, Enabled\n"
) -> dict[tuple[str, ...], str]:
    return {
        gpucheck_mig.SMI_MIG_MODE: modes,
        gpucheck_mig.SMI_LGIP: LGIP_A100_40GB,
        gpucheck_mig.SMI_LGIPP: lgipp,
    }


def test_parse_the_guides_profile_listing() -> None:
    rows = parse_lgip(LGIP_A100_40GB)
    assert [(r.name, r.profile_id, r.free, r.total, r.memory_gib) for r in rows] == [
        ("1g.5gb", 19, 7, 7, 4.75),
        ("1g.5gb+me", 20, 1, 1, 4.75),
        ("1g.10gb", 15, 4, 4, 9.62),
        ("2g.10gb", 14, 3, 3, 9.62),
        ("3g.20gb", 9, 2, 2, 19.5),
        ("4g.20gb", 5, 1, 1, 19.5),
        ("7g.40gb", 0, 1, 1, 39.25),
    ]
    assert {r.gpu for r in rows} == {0}


def test_parse_the_guides_placement_listing() -> None:
    places = parse_lgipp(LGIPP_A100_40GB)
    assert places[(0, 19)] == tuple(MigPlacement(s, 1) for s in range(7))
    assert places[(0, 15)] == tuple(MigPlacement(s, 2) for s in (0, 2, 4, 6))
    assert places[(0, 9)] == (MigPlacement(0, 4), MigPlacement(4, 4))
    assert places[(0, 0)] == (MigPlacement(0, 8),)  # "Placement :" for one
    with pytest.raises(ValueError, match="not understood"):
        parse_lgipp("GPU  0 Profile ID 9 Placements: 0-4\n")


def test_parse_mig_modes() -> None:
    assert parse_mig_modes("0, Enabled\n1, Disabled\n2, [N/A]\n") == {
        0: "Enabled",
        1: "Disabled",
        2: "[N/A]",
    }


def test_profiles_the_agent_reads_match_nvidia_smi() -> None:
    ran: list[tuple[str, ...]] = []
    checks = gpucheck_mig.step5_mig(a100(), runner(answers(), ran))
    by_name = {c.name: c for c in checks}
    for name in ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"):
        check = by_name[f"step5 MIG GPU0 {name}"]
        assert check.status == "PASS", check.line()
    assert "placements {0,4}:4, 19968 MiB" in by_name["step5 MIG GPU0 3g.20gb"].detail
    # names whose slice word picks another NVML profile are said, not compared
    for name in ("1g.5gb+me", "1g.10gb"):
        check = by_name[f"step5 MIG GPU0 {name}"]
        assert check.status == "SKIP"
        assert "as NVML's 1g.5gb" in check.detail
    assert len(checks) == 7
    assert set(ran) == {gpucheck_mig.SMI_MIG_MODE, gpucheck_mig.SMI_LGIP, gpucheck_mig.SMI_LGIPP}


def test_a_difference_fails_naming_both_sides() -> None:
    wrong = LGIPP_A100_40GB.replace("ID  9 Placements: {0,4}:4", "ID  9 Placements: {0}:4")
    checks = gpucheck_mig.step5_mig(a100(), runner(answers(wrong), []))
    (check,) = [c for c in checks if c.name == "step5 MIG GPU0 3g.20gb"]
    assert check.status == "FAIL"
    assert check.detail == "placements: agent {0,4}:4, nvidia-smi {0}:4"
    missing = LGIPP_A100_40GB.replace("GPU  0 Profile ID  0 Placement : {0}:8\n", "")
    checks = gpucheck_mig.step5_mig(a100(), runner(answers(missing), []))
    (check,) = [c for c in checks if c.name == "step5 MIG GPU0 7g.40gb"]
    assert check.status == "FAIL" and "lists no placements for ID 0" in check.detail


@pytest.mark.parametrize(
    ("modes", "said"),
    [
        ("0, Disabled\n", "GPU0 MIG disabled"),
        ("0, [N/A]\n1, [N/A]\n", "GPU0 no MIG, GPU1 no MIG"),
    ],
)
def test_mig_off_or_absent_is_one_skip_and_reads_nothing_more(modes: str, said: str) -> None:
    ran: list[tuple[str, ...]] = []
    checks = gpucheck_mig.step5_mig(a100(None), runner(answers(modes=modes), ran))
    (check,) = checks
    assert check.status == "SKIP"
    assert said in check.detail and "never changes MIG mode" in check.detail
    assert ran == [gpucheck_mig.SMI_MIG_MODE]


def test_only_reading_commands_are_ever_run() -> None:
    """Whatever the answers, no command that could change a GPU: only the three reads."""
    ran: list[tuple[str, ...]] = []
    gpucheck_mig.step5(a100(), runner(answers(), ran))
    for args in ran:
        assert args in {gpucheck_mig.SMI_MIG_MODE, gpucheck_mig.SMI_LGIP, gpucheck_mig.SMI_LGIPP}
        assert not {"-mig", "-cgi", "-dgi", "-cci", "-dci", "-r"} & set(args)


def test_unreadable_mode_is_a_skip_and_a_failing_listing_a_failure() -> None:
    checks = gpucheck_mig.step5_mig(a100(), runner({}, []))
    assert [c.status for c in checks] == ["SKIP"]
    only_mode: dict[tuple[str, ...], str] = {gpucheck_mig.SMI_MIG_MODE: "0, Enabled\n"}
    checks = gpucheck_mig.step5_mig(a100(), runner(only_mode, []))
    assert [c.status for c in checks] == ["FAIL"]
    assert "MIG is on but `nvidia-smi mig -lgip` exited 2" in checks[0].detail
