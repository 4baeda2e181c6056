# Stands in for the image of an NGC Triton release of CUDA 11 or 12 when its python backend stub is
# compiled with TRITON_ENABLE_GPU=ON (no NGC here). A Debian base (BASE, made by
# builder/base/os_image.py) plus a CUDA toolkit laid out as NGC images keep theirs,
# /usr/local/cuda/{bin,nvvm,include,lib64} (targets/x86_64-linux beside them, NVIDIA's
# nvcc.profile), from two sources of the SAME CUDA release, since neither alone has a small one:
#   - Debian's non-free nvidia-cuda-toolkit package (SUITE): nvcc, cicc, cudafe++, fatbinary,
#     nvlink, bin2c. Only that .deb is unpacked: installed with its dependencies it is 1.6-1.8 GB
#     of downloads (nvidia-cuda-dev alone 774 MB, 2.8 GB installed: cuBLAS, cuFFT, cuSPARSE, NPP,
#     static libraries) of which the compile uses none;
#   - PyPI's nvidia-cuda-runtime-cuXX (cuda.h, the runtime headers, libcudart) and
#     nvidia-cuda-nvcc-cuXX (ptxas, nvcc's crt/ headers, libnvvm, libdevice), in wheels/ of the
#     context (put there by tests/conftest.py).
# STATIC_CUDART=1 also takes libcudart_static.a and libcudadevrt.a out of Debian's nvidia-cuda-dev
# (a large download: only for branches whose CMake runs enable_language(CUDA), r24.x onward, whose
# compiler check links them; the NGC images have them). HOST_GXX is the g++ Debian's toolkit depends on; BOOST_TOO_NEW a Boost package the release's
# Ubuntu lacks, refused here so the stub stage falls back to libboost-dev as on the release image.
#   bookworm, for 22.12 (Ubuntu 20.04, CUDA 11.8): CUDA 11.8.89 as 22.12's; default GCC 12, which
#     nvcc 11.8 refuses (Ubuntu 20.04's GCC 9 it accepts): the stage must find g++-11; Boost 1.74
#     (Ubuntu 20.04: 1.71); glibc 2.36, NOT 2.31 (bullseye's toolkit is CUDA 11.2; the GPU-off
#     glibc-2.31 stand-in covers the glibc).
#   trixie, for 24.12 (Ubuntu 24.04, CUDA 12.6): CUDA 12.4.131, NOT 12.6 (the newest Debian
#     packages); default GCC 14, which nvcc 12.4 refuses (g++-13 beside it, Ubuntu 24.04's
#     default); Boost 1.83 as Ubuntu 24.04's; glibc 2.41 (Ubuntu 24.04: 2.39), whose math.h
#     declares sinpi/cospi(f) noexcept, which CUDA 12.4's crt/math_functions.h contradicts (nvcc:
#     "exception specification is incompatible"; CUDA 12.9 fixed it): GLIBC_2_41_MATH=1 marks the
#     four CUDA declarations noexcept as well — a stand-in-only patch, 24.12's glibc 2.39 has no
#     such declarations.
# Not reproduced: NVIDIA's deb packaging and every CUDA library but libcudart, cuDNN, TensorRT,
# Triton itself, and anything run on a GPU (compiling needs none).
ARG BASE
FROM ${BASE}
ARG SUITE
ARG HOST_GXX
ARG BOOST_TOO_NEW=none
ARG GLIBC_2_41_MATH=0
ARG STATIC_CUDART=0
COPY wheels/ /tmp/wheels/
RUN echo "deb http://deb.debian.org/debian ${SUITE} contrib non-free" \
      > /etc/apt/sources.list.d/non-free.list \
 && printf 'Package: %s\nPin: version *\nPin-Priority: -1\n' "${BOOST_TOO_NEW}" \
      > /etc/apt/preferences.d/boost-of-the-release \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${HOST_GXX}" \
 && mkdir /tmp/cuda && cd /tmp/cuda && apt-get download nvidia-cuda-toolkit \
 && dpkg -x nvidia-cuda-toolkit_*.deb deb \
 && for wheel in /tmp/wheels/*.whl; do python3 -m zipfile -e "$wheel" wheel; done \
 && mkdir -p /usr/local/cuda/bin /usr/local/cuda/nvvm/bin /usr/local/cuda/targets/x86_64-linux \
 && cp -a wheel/nvidia/cuda_runtime/include wheel/nvidia/cuda_runtime/lib /usr/local/cuda/ \
 && cp -a wheel/nvidia/cuda_nvcc/include/. /usr/local/cuda/include/ \
 && cp -a wheel/nvidia/cuda_nvcc/nvvm/. /usr/local/cuda/nvvm/ \
 && cp -a wheel/nvidia/cuda_nvcc/bin/ptxas deb/usr/lib/nvidia-cuda-toolkit/bin/nvcc \
      deb/usr/lib/nvidia-cuda-toolkit/bin/crt deb/usr/bin/cudafe++ deb/usr/bin/fatbinary \
      deb/usr/bin/nvlink deb/usr/bin/bin2c /usr/local/cuda/bin/ \
 && cp -a deb/usr/lib/nvidia-cuda-toolkit/bin/cicc /usr/local/cuda/nvvm/bin/ \
 && printf '%s\n' 'TOP = $(_HERE_)/..' 'NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice' \
      'LD_LIBRARY_PATH += $(TOP)/lib:' 'PATH += $(TOP)/nvvm/bin:$(_HERE_):' \
      'INCLUDES += "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)' \
      'LIBRARIES =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"' \
      > /usr/local/cuda/bin/nvcc.profile \
 && chmod +x /usr/local/cuda/bin/* /usr/local/cuda/nvvm/bin/* \
 && if [ "${GLIBC_2_41_MATH}" = 1 ]; then sed -i -E \
      's/^(extern .*__device_builtin__ +(double|float) +(sinpif?|cospif?)\((double|float) x\));/\1 noexcept (true);/' \
      /usr/local/cuda/include/crt/math_functions.h \
    && [ "$(grep -c 'x) noexcept (true);' /usr/local/cuda/include/crt/math_functions.h)" = 4 ]; fi \
 && if [ "${STATIC_CUDART}" = 1 ]; then apt-get download nvidia-cuda-dev \
    && dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb | tar -x --wildcards \
         './usr/lib/x86_64-linux-gnu/libcudart_static.a' './usr/lib/x86_64-linux-gnu/libcudadevrt.a' \
    && mv usr/lib/x86_64-linux-gnu/libcudart_static.a usr/lib/x86_64-linux-gnu/libcudadevrt.a \
         /usr/local/cuda/lib/; fi \
 && cd /usr/local/cuda && ln -s "$(basename lib/libcudart.so.*)" lib/libcudart.so && ln -s lib lib64 \
 && ln -s ../../include targets/x86_64-linux/include && ln -s ../../lib targets/x86_64-linux/lib \
 && rm -rf /tmp/cuda /tmp/wheels /var/lib/apt/lists/* \
 && /usr/local/cuda/bin/nvcc --version | tail -2
