import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

KERNEL = "__global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }"


def fused_ops():
    return load_inline(name="fused_scale", cpp_sources="", cuda_sources=KERNEL, functions=[])


if __name__ == "__main__":
    dist.init_process_group("nccl")
    ops = fused_ops()
