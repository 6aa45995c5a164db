#!/usr/bin/env bash
# CRIU for checkpointed pauses (`pause(mode="checkpoint")`, docs/fork.md). Debian 12's criu
# (3.17.1) cannot start on the kernels rollstack runs on (Linux 6.18: `criu check` stops at
# "Unexpected rt vDSO area bounds"); CRIU 4.1.1, the source of Debian 13 (trixie), can. This
# builds that upstream tarball (its sha256 is the one trixie's Sources index lists) and installs
# only the criu binary as /usr/local/libexec/rollstack/criu (found by rollstack.run.checkpoint).
# Idempotent; needs root and the build packages scripts/setup-system.sh installs.
set -euo pipefail
VERSION=4.1.1
SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
URL=http://deb.debian.org/debian/pool/main/c/criu/criu_${VERSION}.orig.tar.xz
DEST=${CRIU_DEST:-/usr/local/libexec/rollstack/criu}

if [ -x "$DEST" ] && "$DEST" --version 2>/dev/null | grep -qx "Version: $VERSION"; then
    exit 0  # already built
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL --retry 3 -o "$work/criu.tar.xz" "$URL"
echo "$SHA256  $work/criu.tar.xz" | sha256sum -c --quiet -
tar -xJf "$work/criu.tar.xz" -C "$work"
if ! nice make -C "$work/criu-$VERSION" -j"$(nproc)" criu > "$work/build.log" 2>&1; then
    tail -40 "$work/build.log" >&2
    echo "criu/build.sh: building CRIU $VERSION failed" >&2
    exit 1
fi
install -D -m 0755 "$work/criu-$VERSION/criu/criu" "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
echo "built $DEST ($("$DEST" --version | head -1))" >&2
