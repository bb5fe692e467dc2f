"""NVIDIA's words in the protocol, shared by the NVIDIA and fake backends."""

from hami.backends.base import ResourceNames

NVIDIA_RESOURCES = ResourceNames(
    count="nvidia.com/gpu",
    memory="nvidia.com/gpumem",
    memory_percentage="nvidia.com/gpumem-percentage",
    cores="nvidia.com/gpucores",
)
NVIDIA_ALLOCATED = "hami.io/vgpu-devices-allocated"
NVIDIA_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
NVIDIA_PRIORITY = "nvidia.com/priority"  # container limit: CUDA_TASK_PRIORITY, 0 high, 1 low
