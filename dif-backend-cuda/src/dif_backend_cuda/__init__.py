"""dif-backend-cuda: runs dif plans on NVIDIA GPUs. CuPy holds memory, streams and events and loads
NVRTC-compiled kernels; cuBLASLt (through nvmath-python) does GEMMs and cuDNN's fused SDPA does
attention where they apply; a prepared program is one arena allocation and one CUDA graph.

Nothing GPU-side is imported here: `import dif_backend_cuda` works on any machine, and
`dif_backend_cuda.plugin` registers the backend through the `dif` entry point.
"""

from dif_backend_cuda.device import CudaBackend, cuda_availability, probe_budget, probe_profile

__version__ = "0.1.0"

__all__ = ["CudaBackend", "__version__", "cuda_availability", "probe_budget", "probe_profile"]
