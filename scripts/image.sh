#!/usr/bin/env bash
# Build the pyepp container image without a Docker engine: debootstrap makes a Debian bookworm base with the
# distribution's Python 3.11, buildah (chroot isolation, as root) builds the Dockerfile on it. See docs/deploy.md.
#   IMAGE_TAG (default localhost/pyepp:dev)  DEBIAN_MIRROR  IMAGE_WORKDIR (default /var/tmp/pyepp-image)
#   REBUILD_BASE=1 rebuilds the base even when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${IMAGE_TAG:-localhost/pyepp:dev}
# The base tag names its recipe: bump the suffix whenever the debootstrap step below changes (a stored base is reused).
BASE=${BASE_TAG:-localhost/pyepp-base:bookworm-py311-2}
WORK=${IMAGE_WORKDIR:-/var/tmp/pyepp-image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export DEBIAN_FRONTEND=noninteractive

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq buildah debootstrap >/dev/null
fi

if [[ -n "${REBUILD_BASE:-}" ]] || ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  echo "image: debootstrap bookworm (minbase + python3) into $WORK/rootfs"
  rm -rf "$WORK/rootfs" && mkdir -p "$WORK"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  # Nothing at run time reads these: docs, man pages, translations, apt's caches, glibc's iconv modules, perl
  # (only dpkg's maintainer scripts use it; nothing is installed with dpkg in the image).
  r=$WORK/rootfs
  # The standard library's bytecode (~14 MB) is never read: the image sets PYTHONPYCACHEPREFIX, so Python looks for
  # bytecode only under /cache/pycache. Nor are lib2to3, pydoc's topics or the test package imported.
  rm -rf "$r"/usr/share/{doc,man,info,locale,lintian}/* "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/* "$r"/var/log/* \
    "$r"/usr/lib/x86_64-linux-gnu/gconv "$r"/usr/lib/x86_64-linux-gnu/perl-base "$r"/usr/share/perl5 "$r"/usr/bin/perl* \
    "$r"/usr/lib/python3.11/{lib2to3,pydoc_data,test} "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
  find "$r"/usr/lib/python3* -depth -name __pycache__ -type d -exec rm -rf {} +
  tar -C "$WORK/rootfs" -cf "$WORK/base.tar" .
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$WORK/base.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
  rm -rf "$WORK/rootfs" "$WORK/base.tar"
fi

echo "image: buildah bud $TAG (PYTHON_IMAGE=$BASE)"
buildah bud --isolation chroot --format docker --layers=false --build-arg "PYTHON_IMAGE=$BASE" \
  --volume /etc/ssl/certs:/etc/ssl/certs:ro -t "$TAG" .
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$TAG"
