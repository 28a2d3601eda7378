#!/usr/bin/env bash
# Build Phalanx's container image with no registry base image, as an OCI archive.
#
#   deploy/image/build.sh [--out FILE] [--name REF] [--suite SUITE] [--python PY] [--base-only]
#
# --base-only writes just the Debian base (python3 and its venv module, no Phalanx): a BASE for
# the Dockerfile where no registry image can be pulled.
#
# 1. the Phalanx wheel and the wheels of everything it needs (`.[node]`; not the `report` extra,
#    matplotlib, which only `phalanx simulate` uses), built or fetched by the host's pip (Python 3.11,
#    like Debian bookworm's), so the image build itself needs no index;
# 2. a Debian base (mmdebstrap --variant=minbase: python3, python3-venv, ca-certificates) with a
#    venv at /opt/phalanx holding those wheels, installed offline inside the new root;
# 3. one layer from that root, committed by buildah as an OCI archive that `ctr images import`,
#    `podman load`, `skopeo copy oci-archive:...` and `docker load` (through skopeo) take.
# Needs root (mmdebstrap's root mode and buildah), mmdebstrap and buildah (Debian packages) and
# network to Debian's archive and to the Python package index.
#
# The tarball is deterministic for the same inputs: SOURCE_DATE_EPOCH (default: the last commit's
# time) fixes every file time and the image's creation time, and mmdebstrap sorts the tar. What the
# image holds is recorded inside it: /opt/phalanx/BUILDINFO lists the Debian packages and the
# Python distributions with their versions.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1)"
out=""
name=""
suite="bookworm"
python="${PYTHON:-python3}"
base_only=0

while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --base-only) base_only=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$base_only" = 1 ]; then
  out="${out:-$repo/dist/debian-python-$suite.tar}"; name="${name:-phalanx.local/debian-python:$suite}"
else
  out="${out:-$repo/dist/phalanx-image-$version.tar}"; name="${name:-phalanx.local/phalanx:$version}"
fi
die() { echo "build.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap's root mode and buildah)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
command -v buildah >/dev/null || die "buildah is missing (apt-get install buildah)"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$pyver" = 3.11 ] || die "$python is Python $pyver; the wheels must be built for Debian bookworm's 3.11 (--python)"

export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/phalanx-image.XXXXXX")"
ctr=""
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
start=$(date +%s)

hooks=()
if [ "$base_only" = 0 ]; then
  echo "build.sh: wheels (Phalanx $version and its dependencies)" >&2
  "$python" -m pip wheel --quiet --wheel-dir "$work/wheels" "$repo[node]"
  hooks=(
    --customize-hook="copy-in $work/wheels /tmp"
    --customize-hook='chroot "$1" python3 -m venv /opt/phalanx'
    --customize-hook='chroot "$1" /opt/phalanx/bin/pip install --quiet --no-index --find-links /tmp/wheels --no-cache-dir "phalanx[node]"'
    --customize-hook='chroot "$1" groupadd --gid 65532 phalanx && chroot "$1" useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx'
    --customize-hook='{ echo "# Debian packages"; chroot "$1" dpkg-query -W; echo "# Python distributions"; chroot "$1" /opt/phalanx/bin/pip freeze --all; } > "$1/opt/phalanx/BUILDINFO"'
    --customize-hook='chroot "$1" /opt/phalanx/bin/pip uninstall --quiet --yes pip setuptools wheel'
  )
fi

echo "build.sh: Debian $suite base$([ "$base_only" = 1 ] || echo ' and /opt/phalanx') (mmdebstrap)" >&2
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "${hooks[@]}" \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
  "$suite" "$work/rootfs.tar"

echo "build.sh: OCI archive $out ($name, buildah)" >&2
ctr="$(buildah from --quiet scratch)"
buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
if [ "$base_only" = 1 ]; then
  buildah config --cmd python3 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
else
  buildah config \
    --entrypoint '["/opt/phalanx/bin/phalanx"]' --cmd 'scheduler --in-cluster' \
    --user 65532:65532 --workingdir / \
    --env PATH=/opt/phalanx/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env HOME=/tmp --env PYTHONDONTWRITEBYTECODE=1 \
    --label org.opencontainers.image.title=phalanx \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$ctr"
fi
mkdir -p "$(dirname "$out")"
rm -f "$out"
buildah commit --quiet --format oci --disable-compression=false --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "oci-archive:$out:$name" >/dev/null
ctr=""
echo "build.sh: $out: $(du -m "$out" | cut -f1) MiB, $(( $(date +%s) - start )) s" >&2
echo "$out"
