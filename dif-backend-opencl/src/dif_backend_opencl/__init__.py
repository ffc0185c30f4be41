"""dif-backend-opencl: runs dif plans on any OpenCL 1.2+ device through pyopencl (PoCL on CPUs in
CI; AMD, Intel and NVIDIA GPUs). Activations stay on the device in one planned arena; kernels
are OpenCL C files shipped in `kernels/`.

Registered with dif through the `dif` entry point (`dif_backend_opencl.plugin`). Importing this
package does not import pyopencl.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
