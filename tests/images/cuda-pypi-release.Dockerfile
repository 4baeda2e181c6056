# Stands in for the image of an NGC Triton release of CUDA 13 (25.08 to 25.11, Ubuntu 24.04) when
# its python backend stub is compiled with TRITON_ENABLE_GPU=ON (no NGC here, and no Debian package
# of CUDA 13): Debian trixie plus CUDA 13.0 from PyPI's wheels (wheels/ in the context, put there
# by tests/conftest.py) — nvidia-cuda-nvcc (nvcc, cudafe++, ptxas, fatbinary, nvlink),
# nvidia-nvvm (cicc, libnvvm, libdevice), nvidia-cuda-crt (nvcc's crt/ headers),
# nvidia-cuda-runtime (the runtime headers, libcudart) and nvidia-cuda-cccl (CUB, Thrust,
# libcu++), all of one CUDA 13.0 — merged into the NGC layout, /usr/local/cuda/{bin,nvvm,include,
# lib64} with targets/x86_64-linux beside them as NVIDIA's installers make it.
# Differs from the release image: glibc 2.41 and default GCC 14 (Ubuntu 24.04: 2.39, GCC 13;
# nvcc 13.0 accepts either), Boost 1.83 as Ubuntu 24.04's; NVIDIA's deb packaging of the toolkit
# and every CUDA library but libcudart are absent, and nothing runs on a GPU (compiling needs none).
ARG BASE
FROM ${BASE}
COPY wheels/ /tmp/wheels/
RUN mkdir /tmp/cuda \
 && for wheel in /tmp/wheels/*.whl; do python3 -m zipfile -e "$wheel" /tmp/cuda; done \
 && mv /tmp/cuda/nvidia/cu13 /usr/local/cuda \
 && rm -rf /tmp/cuda /tmp/wheels /usr/local/cuda/.metadata \
 && chmod +x /usr/local/cuda/bin/* /usr/local/cuda/nvvm/bin/* \
 && ln -s libcudart.so.13 /usr/local/cuda/lib/libcudart.so \
 && ln -s lib /usr/local/cuda/lib64 \
 && mkdir -p /usr/local/cuda/targets/x86_64-linux \
 && ln -s ../../include /usr/local/cuda/targets/x86_64-linux/include \
 && ln -s ../../lib /usr/local/cuda/targets/x86_64-linux/lib \
 && /usr/local/cuda/bin/nvcc --version | tail -2
