# Stands in for the image of an Ubuntu 20.04 release (22.12, the CUDA 11.8 one) when a stub is
# compiled on it: glibc 2.31, a system python3 older than the pipeline's, no package of the
# pipeline's Python and a CMake (Debian bullseye: 3.18) the build does not use. No Triton: a
# 22.12 server cannot run here. Built by tests/conftest.py.
ARG BASE
FROM ${BASE}
# The bullseye-security mirror this machine reaches lists libarchive versions its pool lacks.
RUN printf 'Package: libarchive13 libarchive-dev\nPin: release n=bullseye\nPin-Priority: 1001\n' \
      > /etc/apt/preferences.d/libarchive-from-bullseye
