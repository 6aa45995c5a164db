#!/usr/bin/env bash
# Installs every Debian package rollstack uses. Idempotent; needs root.
set -euo pipefail
PKGS=(fuse3 libfuse3-dev pkg-config runc docker-registry containerd skopeo umoci debootstrap
      busybox-static iproute2 zstd catatonit tini git patch ca-certificates pigz
      gcc libc6-dev nftables runsc wrk isal buildah
      # CRIU 4.1.1's build (third_party/criu/build.sh: Debian 12's criu cannot run on Linux 6.18)
      make curl xz-utils protobuf-c-compiler protobuf-compiler libprotobuf-c-dev libprotobuf-dev
      python3-protobuf libnl-3-dev libnet1-dev libcap-dev libaio-dev libbsd-dev libnftables-dev
      libgnutls28-dev libdrm-dev uuid-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The Debian docker-registry package starts a service on :5000; rollstack runs its own.
if command -v systemctl >/dev/null 2>&1; then systemctl disable --now docker-registry >/dev/null 2>&1 || true; fi
modprobe fuse 2>/dev/null || true
modprobe overlay 2>/dev/null || true
