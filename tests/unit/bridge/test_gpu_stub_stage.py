"""The stub's build stage with ``TRITON_ENABLE_GPU=ON``, rendered and probed without compiling.

The compiles themselves run on CUDA stand-ins in ``tests/e2e/test_gpu_stub_build.py``.
"""

from __future__ import annotations

import subprocess

from builder.bridge.stub_build import CUDA_HOST_COMPILER_SCRIPT, render_stub_dockerfile


def test_the_gpu_stage_names_the_toolkit_and_keeps_host_flags_from_nvcc():
    """FindCUDA hands CMAKE_CXX_FLAGS to nvcc unless told not to; ours has '-include functional',
    which breaks backend r22.12's kernel.cu (``redefinition of 'struct std::unary_function'``)."""
    common = dict(branch="r22.12", python_version="3.11", build_image_name="release",
                  python_image="python", local_sources=True)
    gpu = render_stub_dockerfile(gpu=True, **common)
    assert "-DCUDA_PROPAGATE_HOST_FLAGS=OFF" in gpu
    assert "-DCUDAToolkit_ROOT=/usr/local/cuda" in gpu
    assert "python3 /cuda_host_compiler.py /usr/local/cuda/bin/nvcc" in gpu
    cpu = render_stub_dockerfile(gpu=False, **common)
    assert "CUDA" not in cpu.replace("-DTRITON_ENABLE_GPU=OFF", "")


def test_the_host_compiler_probe_names_the_missing_toolkit(tmp_path):
    """Run as the stage runs it: without nvcc where NGC images keep it, the build stops naming
    the path and why, before CMake's own less direct failure."""
    result = subprocess.run(["python3", str(CUDA_HOST_COMPILER_SCRIPT),
                             str(tmp_path / "cuda" / "bin" / "nvcc")],
                            capture_output=True, text=True)
    assert result.returncode == 1 and not result.stdout
    assert f"no nvcc at {tmp_path}/cuda/bin/nvcc" in result.stderr
    assert "/usr/local/cuda" in result.stderr
