# Stands in for a new machine of the project's kind when the test command is timed on one
# (tests/support/new_machine.py): the project's own Debian bookworm OS image (BASE) with what such
# a machine has before anything is installed on it: a C toolchain and Python's headers, git, the
# usual command-line tools, and the Docker client (no engine). The machine's Python (its CPython
# with pip and venv), its wheel directories and package indexes, its pip configuration and the
# host's CA bundle (the HTTPS proxy's) come from the host at run time, read-only or copied.
# Not reproduced: the hundreds of other Debian packages the machine's image carries (desktop,
# databases, other toolchains) that the project does not use.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential python3-dev git curl wget procps psmisc iproute2 lsof file xz-utils zstd \
      unzip patch gnupg openssl util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY docker /usr/local/bin/docker
