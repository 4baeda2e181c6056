"""Where build-time packages come from, and which certificate authorities to trust getting them.

Companies mirror PyPI (``index_url``), add private indexes (``extra_index_urls``), keep wheels
in a directory (``find_links``), and put HTTPS behind an intercepting proxy whose CA is not in
any default bundle (``ca_bundle``). Packages are downloaded on the build host, so these go to
the host's ``pip`` (and to conda through its environment variables); the container that builds
the environment in the target image gets no network at all and needs none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder.environment.errors import PackError


@dataclass(frozen=True)
class PackageIndex:
    """Package sources and trust for building environments; the default is pip's own setup."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    ca_bundle: Path | None = None

    def pip_arguments(self) -> list[str]:
        """Arguments for ``pip download``/``pip install`` (they override pip's config files)."""
        arguments: list[str] = []
        if self.index_url:
            arguments += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            arguments += ["--extra-index-url", url]
        for location in self.find_links:
            arguments += ["--find-links", location]
        for host in self.trusted_hosts:
            arguments += ["--trusted-host", host]
        if self.ca_bundle is not None:
            arguments += ["--cert", str(self.checked_ca_bundle())]
        return arguments

    def environment(self) -> dict[str, str]:
        """Variables for tools configured by the environment: conda, pip run by conda, and pip.

        pip needs them too: its HTTP library lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
        (set machine-wide on many hosts) override ``--cert``, so the bundle goes in both.
        """
        variables: dict[str, str] = {}
        if self.index_url:
            variables["PIP_INDEX_URL"] = self.index_url
        if self.extra_index_urls:
            variables["PIP_EXTRA_INDEX_URL"] = " ".join(self.extra_index_urls)
        if self.find_links:
            variables["PIP_FIND_LINKS"] = " ".join(self.find_links)
        if self.trusted_hosts:
            variables["PIP_TRUSTED_HOST"] = " ".join(self.trusted_hosts)
        if self.ca_bundle is not None:
            bundle = str(self.checked_ca_bundle())
            variables.update(PIP_CERT=bundle, REQUESTS_CA_BUNDLE=bundle, CURL_CA_BUNDLE=bundle,
                             SSL_CERT_FILE=bundle, CONDA_SSL_VERIFY=bundle)
        return variables

    def fingerprint(self) -> str:
        """What changes which packages resolve (the CA bundle does not: it is left out)."""
        return json.dumps([self.index_url, list(self.extra_index_urls), list(self.find_links)])

    def checked_ca_bundle(self) -> Path:
        """The CA bundle, once it is known to be a readable PEM file."""
        assert self.ca_bundle is not None
        bundle = Path(self.ca_bundle)
        try:
            text = bundle.read_text(errors="replace")
        except OSError as error:
            raise PackError(f"CA bundle {bundle} cannot be read: {error}") from error
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise PackError(
                f"CA bundle {bundle} holds no PEM certificate: give a file of "
                f"'-----BEGIN CERTIFICATE-----' blocks (e.g. /etc/ssl/certs/ca-certificates.crt "
                f"with your proxy's CA appended)"
            )
        return bundle
