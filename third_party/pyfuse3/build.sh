#!/usr/bin/env bash
# Build and install pyfuse3 3.5.0 with rollstack's patch (rollstack.patch beside this file)
# into the virtualenv whose bin/ directory is $1 (without its dependency trio: the project's
# own install brings that, pinned). The patch adds:
#   - no-open mode: when `open` answers ENOSYS the kernel stops sending OPEN and RELEASE
#     (and keeps the page cache); pyfuse3 then calls `read_unopened(inode, off, size, ctx)`;
#   - no-opendir mode: when `opendir` answers ENOSYS the kernel stops sending OPENDIR and
#     RELEASEDIR and caches directory listings; `readdir` then gets the inode as its fh;
#   - `enable_cache_symlinks`: asks the kernel to cache symlink targets;
#   - `connection_fd()` and `assume_init(request)`: a restarted daemon takes a held /dev/fuse
#     connection over (src/rollstack/mount/holder.py);
#   - level 3: `set_no_xattr_ranges(ranges, xattr_inodes)`: getxattr/listxattr of inodes declared
#     to have no xattrs are answered ENODATA / empty in C (overlayfs probes trusted.overlay.* on
#     every lower inode of every new overlay mount), then the next queued requests are processed
#     without a trip through trio while they are answered synchronously; `fast_path_stats()`;
#   - level 4: `set_fast_linger(us)`: after a request answered in C, the next one is waited for
#     up to `us` microseconds (a walker's next probe comes a few microseconds after the reply).
# rollstack works on an unpatched pyfuse3 too (it checks `pyfuse3.ROLLSTACK_PATCH`), with three
# FUSE requests more per opened file and no handover. docs/lazy-store.md has the measurements.
set -euo pipefail
BIN=${1:?usage: build.sh VENV/bin}
VERSION=3.5.0
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
HERE=$(cd "$(dirname "$0")" && pwd)
LEVEL=$(sed -n 's/^+ROLLSTACK_PATCH = //p' "$HERE/rollstack.patch")

if "$BIN/python" -c "import pyfuse3, sys; sys.exit(0 if getattr(pyfuse3, 'ROLLSTACK_PATCH', 0) == $LEVEL else 1)" 2>/dev/null; then
    exit 0  # already installed at this patch level
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN/pip" download -q --no-deps --no-binary :all: -d "$work" "pyfuse3==$VERSION"
echo "$SHA256  $work/pyfuse3-$VERSION.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/pyfuse3-$VERSION.tar.gz" -C "$work"
patch -d "$work/pyfuse3-$VERSION" -p1 --quiet < "$HERE/rollstack.patch"
SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION+rollstack$LEVEL" "$BIN/pip" install -q --force-reinstall --no-deps "$work/pyfuse3-$VERSION"
