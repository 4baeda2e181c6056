# Stands in for Docker Hub's python:X.Y-slim-<suite> (no Docker Hub here): CPython built from the
# Debian source package on an older Debian, installed the way the official image installs it —
# /usr/local, a shared libpython, headers, no test suite (the official image deletes it after
# installing; --disable-test-modules neither builds nor installs it). On bullseye (glibc 2.31,
# as Ubuntu 20.04's) it is the interpreter image of a 22.12 (CUDA 11.8) bridge. Built by
# tests/conftest.py.
# Compiled at -O1 without debug information (CPython's default is -g -O3): the tests need its
# headers, its shared libpython and an interpreter that runs, not its speed, and on a fresh
# machine each of the two is built beside the suite's compiles (Python 3.11's: 82 s instead of
# 105 s here, quiet). Neither flag changes the ABI the stubs compile against.
ARG BASE
FROM ${BASE}
ARG PYTHON
ARG SOURCE_SUITE
RUN echo "deb-src http://deb.debian.org/debian ${SOURCE_SUITE} main" \
      > /etc/apt/sources.list.d/python-source.list \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc make xz-utils libc6-dev libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev \
      libsqlite3-dev uuid-dev libexpat1-dev \
 && mkdir /tmp/python && cd /tmp/python \
 && apt-get source --download-only "python${PYTHON}/${SOURCE_SUITE}" \
 && tar xf python${PYTHON}_*.orig.tar.[gx]z \
 && cd Python-${PYTHON}.* \
 && ./configure --prefix=/usr/local --enable-shared --with-ensurepip=no --without-static-libpython \
      --disable-test-modules OPT="-DNDEBUG -fwrapv -O1" > /dev/null \
 && make -j"$(nproc)" > /dev/null \
 && make install > /dev/null \
 && ldconfig \
 && cd / && rm -rf /tmp/python \
 && apt-get purge -y --auto-remove gcc make xz-utils \
 && rm -rf /var/lib/apt/lists/* \
 && python${PYTHON} -c "import ssl, sqlite3, ctypes, sysconfig; print(sysconfig.get_paths()['include'])"
