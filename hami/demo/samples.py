"""The demo's sample pods, written once for both modes.

``hami demo`` submits all of them through the extender; ``hami demo --mode dra`` submits
the HAMi-core ones unchanged and hami's webhook turns each into a claim (docs/dra.md
"Unchanged HAMi pods"). The MIG and Ascend ones have no DRA form in this demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami.testkit.cluster import DEMO_ASCEND_NODE, gpu_pod, limits

UNFIT = "too-big"
#: pods that ask for HAMi-core say so, which keeps them off the MIG GPU (a pod without
#: ``nvidia.com/vgpu-mode`` may take any GPU, as in Go HAMi: there, a MIG instance)
HAMI_CORE = {"nvidia.com/vgpu-mode": "hami-core"}
MIG = {"nvidia.com/vgpu-mode": "mig"}


@dataclass(frozen=True)
class Sample:
    name: str
    request: str  # what it asks for, in words
    pod: dict[str, Any]
    started: bool = True  # False: on a node nothing starts pods on (an Ascend stand-in)


def _hami_core(sample: Sample) -> Sample:
    metadata = sample.pod["metadata"]
    metadata["annotations"] = {**HAMI_CORE, **metadata.get("annotations", {})}
    return sample


def ascend_pod(name: str, word: str, memory: int) -> dict[str, Any]:
    """A pod asking for one vNPU of ``memory`` MiB of an Ascend ``word``."""
    return gpu_pod(name, [{f"huawei.com/{word}": "1", f"huawei.com/{word}-memory": str(memory)}])


def samples(ascend_agent: bool = True) -> list[Sample]:
    """The extender demo's workloads: every HAMi-core request shape, a selector, MIG
    instances, an Ascend vNPU and one that cannot fit. ``ascend_agent``: whether an agent
    serves the Ascend node (else its pod is only bound)."""
    word = DEMO_ASCEND_NODE.word
    core = hami_core_samples()
    return [
        *core[:-1],
        Sample(
            "mig-small",
            "4000 MiB on MIG (vgpu-mode: mig)",
            gpu_pod("mig-small", [limits(1, mem=4000)], annotations=MIG),
        ),
        Sample(
            "mig-large",
            "18000 MiB on MIG (vgpu-mode: mig)",
            gpu_pod("mig-large", [limits(1, mem=18000)], annotations=MIG),
        ),
        Sample(
            "npu-vnpu",
            f"20000 MiB of an {word}",
            ascend_pod("npu-vnpu", word, 20000),
            started=ascend_agent,
        ),
        core[-1],
    ]


def hami_core_samples() -> list[Sample]:
    """The HAMi-core pods (``vgpu-mode: hami-core``), the one that cannot fit last: what
    both modes run."""
    plain = [
        Sample(
            "train-a100",
            "1 whole A100",
            gpu_pod("train-a100", [limits(1)], annotations={"nvidia.com/use-gputype": "A100"}),
        ),
        Sample("infer-small", "3000 MiB", gpu_pod("infer-small", [limits(1, mem=3000)])),
        Sample(
            "infer-half",
            "50% memory, 30% cores",
            gpu_pod("infer-half", [limits(1, pct=50, cores=30)]),
        ),
        Sample(
            "multi-gpu",
            "2 GPUs x 8000 MiB, 50% cores",
            gpu_pod("multi-gpu", [limits(2, mem=8000, cores=50)]),
        ),
        Sample(
            "sidecars",
            "2 containers: 4000 + 2000 MiB",
            gpu_pod("sidecars", [limits(1, mem=4000), limits(1, mem=2000)]),
        ),
        Sample(
            "with-init",
            "init 2000 MiB, then 6000 MiB",
            gpu_pod("with-init", [limits(1, mem=6000)], init=[limits(1, mem=2000)]),
        ),
        Sample(
            "on-v100",
            "10000 MiB on a V100 (use-gputype)",
            gpu_pod(
                "on-v100",
                [limits(1, mem=10000, cores=25)],
                annotations={"nvidia.com/use-gputype": "V100"},
            ),
        ),
        Sample(
            "spread-me",
            "2000 MiB, node policy spread",
            gpu_pod(
                "spread-me",
                [limits(1, mem=2000)],
                annotations={"hami.io/node-scheduler-policy": "spread"},
            ),
        ),
        Sample(UNFIT, "64000 MiB (no GPU is that large)", gpu_pod(UNFIT, [limits(1, mem=64000)])),
    ]
    return [_hami_core(s) for s in plain]
