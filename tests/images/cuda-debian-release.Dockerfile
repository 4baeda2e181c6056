# Stands in for the image of an NGC Triton release when its python backend stub is compiled with
# TRITON_ENABLE_GPU=ON (no NGC here): a Debian base plus Debian's non-free CUDA toolkit, laid out
# where the release images keep theirs (/usr/local/cuda/{bin,include,lib64}; Debian's own
# /usr/bin/nvcc is removed, so the build must find the toolkit where NGC images have it).
# Built by tests/conftest.py with BASE (a Debian image made by builder/base/os_image.py) and
# BOOST_TOO_NEW (Boost packages the release's Ubuntu lacks, refused here so the stub stage falls
# back to the distribution's libboost-dev as it does on the release image).
#   Debian bookworm (for 22.12, Ubuntu 20.04, CUDA 11.8): toolkit 11.8.89 as in 22.12; GCC 12 is
#     the default compiler and nvcc 11.8 refuses it (Debian's package brings g++-11; Ubuntu 20.04's
#     default GCC 9 is accepted); Boost 1.74 (Ubuntu 20.04: 1.71); glibc 2.36, NOT 2.31 — the
#     glibc-2.31 stand-in (bullseye, GPU off) covers that; bullseye's toolkit is CUDA 11.2.
#   Debian trixie (for 24.12, Ubuntu 24.04, CUDA 12.6): toolkit 12.4.131 — NOT 12.6, the newest
#     Debian packages; default GCC 14, refused by nvcc 12.4 (Debian's package brings g++-13, the
#     default GCC of Ubuntu 24.04); Boost 1.83 and glibc 2.41 (Ubuntu 24.04: 1.83 and 2.39).
# Not reproduced: NVIDIA's own packaging of the toolkit (file names and versions of the libraries
# beside libcudart), cuDNN/TensorRT/Triton itself, and anything run on a GPU (compiling needs none).
# Only what the compile uses is kept: nvcc and its tools, libnvvm, the CUDA headers and libcudart;
# cuBLAS, cuFFT, cuSPARSE, cuSOLVER, cuRAND, NPP, nvJPEG and the profilers go in the same layer.
ARG BASE
FROM ${BASE}
ARG SUITE
ARG BOOST_TOO_NEW=none
RUN echo "deb http://deb.debian.org/debian ${SUITE} contrib non-free" \
      > /etc/apt/sources.list.d/non-free.list \
 && printf 'Package: %s\nPin: version *\nPin-Priority: -1\n' "${BOOST_TOO_NEW}" \
      > /etc/apt/preferences.d/boost-of-the-release \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nvidia-cuda-toolkit \
 && rm -rf /var/lib/apt/lists/* \
 && cd /usr/lib/x86_64-linux-gnu \
 && rm -rf libcublas* libcufft* libcusolver* libcusparse* libcurand* libnpp* libnvblas* \
      libnvjpeg* libcupti* libnvperf* libaccinj* libcuinj* libnvrtc* libOpenCL* libcufile* \
      /usr/lib/nvidia-cuda-toolkit/libnvvp /usr/share/doc/nvidia* \
 && mkdir -p /usr/local/cuda/include /usr/local/cuda/lib64 \
 && ln -s /usr/lib/nvidia-cuda-toolkit/bin /usr/local/cuda/bin \
 && for header in $(dpkg -L nvidia-cuda-dev | sed -n 's|^/usr/include/||p'); do \
      [ -e "/usr/include/$header" ] && [ ! -d "/usr/include/$header" ] || continue; \
      mkdir -p "/usr/local/cuda/include/$(dirname "$header")"; \
      ln -s "/usr/include/$header" "/usr/local/cuda/include/$header"; done \
 && for library in /usr/lib/x86_64-linux-gnu/libcudart* /usr/lib/x86_64-linux-gnu/libcudadevrt*; do \
      [ -e "$library" ] && ln -s "$library" /usr/local/cuda/lib64/; done \
 && ln -s /usr/lib/nvidia-cuda-toolkit/libdevice /usr/local/cuda/nvvm 2>/dev/null || true \
 && rm -f /usr/bin/nvcc \
 && /usr/local/cuda/bin/nvcc --version | tail -2 \
 && ls /usr/local/cuda/include/cuda_runtime.h /usr/local/cuda/lib64/libcudart.so
