# python_backend r24.12 stub for Python 3.11, built on nvcr.io/nvidia/tritonserver:24.12-py3.
FROM nvcr.io/nvidia/tritonserver:24.12-py3
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake make g++ git ca-certificates rapidjson-dev libarchive-dev zlib1g-dev googletest \
      python3.11-dev \
 && (DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libboost1.81-dev \
     || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libboost-dev) \
 && rm -rf /var/lib/apt/lists/*
RUN git clone --depth 1 --branch r24.12 https://github.com/triton-inference-server/python_backend /src/python_backend
RUN python3 -c 'import pathlib, re, sys; p = pathlib.Path(sys.argv[1]); s = p.read_text(); s = re.sub(r'"'"'ExternalProject_Add\(\s*boostorg.*?\n\)\n'"'"', '"'"'add_custom_target(boostorg)\n'"'"', s, flags=re.S); s = s.replace('"'"'set(boostorg_INCLUDE_DIRS "${CMAKE_BINARY_DIR}/boost/")'"'"', '"'"'set(boostorg_INCLUDE_DIRS "/usr/include")'"'"'); p.write_text(s)' /src/python_backend/CMakeLists.txt
WORKDIR /src/python_backend/build
RUN cmake .. -DCMAKE_BUILD_TYPE=Release -DTRITON_ENABLE_GPU=ON \
      '-DCMAKE_CXX_FLAGS=-include functional' \
      -DTRITON_BACKEND_REPO_TAG=r24.12 -DTRITON_COMMON_REPO_TAG=r24.12 \
      -DTRITON_CORE_REPO_TAG=r24.12 \
      -DPYTHON_EXECUTABLE=/usr/bin/python3.11 \
      -DPython_EXECUTABLE=/usr/bin/python3.11 \
      -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
 && make -j2 triton-python-backend-stub \
 && cp triton_python_backend_stub /triton_python_backend_stub
