# python_backend r25.11 stub for Python 3.11, built on nvcr.io/nvidia/tritonserver:25.11-py3.
FROM python:3.11-slim-bookworm AS python
COPY interpreter_copy.py /interpreter_copy.py
RUN python3.11 /interpreter_copy.py /opt/python --development > /dev/null

FROM nvcr.io/nvidia/tritonserver:25.11-py3
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      make g++ git ca-certificates rapidjson-dev libarchive-dev zlib1g-dev googletest \
 && (DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libboost1.81-dev \
     || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libboost-dev) \
 && rm -rf /var/lib/apt/lists/*
COPY cmake/ /opt/cmake/
COPY unity_make.py /unity_make.py
COPY cuda_host_compiler.py /cuda_host_compiler.py
COPY --from=python /opt/python /opt/python
RUN git clone --depth 1 --branch r25.11 https://github.com/triton-inference-server/python_backend /src/python_backend
RUN python3 -c 'import pathlib, re, sys; p = pathlib.Path(sys.argv[1]); s = p.read_text(); s = re.sub(r'"'"'ExternalProject_Add\(\s*boostorg.*?\n\)\n'"'"', '"'"'add_custom_target(boostorg)\n'"'"', s, flags=re.S); s = s.replace('"'"'set(boostorg_INCLUDE_DIRS "${CMAKE_BINARY_DIR}/boost/")'"'"', '"'"'set(boostorg_INCLUDE_DIRS "/usr/include")'"'"'); p.write_text(s)' /src/python_backend/CMakeLists.txt
WORKDIR /src/python_backend/build
RUN CUDAHOSTCXX="$(python3 /cuda_host_compiler.py /usr/local/cuda/bin/nvcc)" \
 && export CUDAHOSTCXX && echo "CUDA host compiler: $CUDAHOSTCXX" \
 && /opt/cmake/bin/cmake .. -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON -DTRITON_ENABLE_GPU=ON \
      '-DCMAKE_CXX_FLAGS=-include functional' \
      -DCUDAToolkit_ROOT=/usr/local/cuda -DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCUDA_HOST_COMPILER="$CUDAHOSTCXX" \
      -DCUDA_PROPAGATE_HOST_FLAGS=OFF \
      -DTRITON_BACKEND_REPO_TAG=r25.11 -DTRITON_COMMON_REPO_TAG=r25.11 \
      -DTRITON_CORE_REPO_TAG=r25.11 \
      -DPYTHON_EXECUTABLE=/opt/python/bin/python3.11-build \
      -DPython_EXECUTABLE=/opt/python/bin/python3.11-build \
      -DPYTHON_INCLUDE_DIR=/opt/python/include/python3.11 \
      -DPYTHON_LIBRARY=/opt/python/lib/libpython3.11.so \
      -DCMAKE_SKIP_RPATH=ON -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
 && python3 /unity_make.py /opt/cmake/bin/cmake 2 triton-python-backend-stub \
 && cp triton_python_backend_stub /triton_python_backend_stub
