#!/usr/bin/env bash
# Build the runtime image from deploy/Containerfile with podman (buildah works the same way).
#
#   bash scripts/build_image.sh CATALOG_DIR [TAG]
#
# CATALOG_DIR holds workloads.yaml and its manifests; it lands at /opt/dpone/catalog/ in the image,
# so generate the DAGs with airflow.catalog_path: /opt/dpone/catalog/workloads.yaml. TAG defaults
# to localhost/dpone-runtime:0.1.0.
#
# DPONE_IMAGE_EXTRAS names the runtime wheel's extras the image installs, comma-separated (default
# postgres; the others: mysql, metrics, lineage, progress, mssql, the last needing an ODBC driver
# for SQL Server in the base, which this recipe does not add).
#
# DPONE_IMAGE_BASE names the base image, pinned (exact tag or @sha256 digest). Without it the base
# is made here from Debian 12's packages: debootstrap (minbase, python3, python3-venv) into
# .cache/image/rootfs, imported as localhost/dpone-base:bookworm-minbase. That needs root, podman
# and debootstrap (Debian: apt-get install podman debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
catalog=${1:?usage: scripts/build_image.sh CATALOG_DIR [TAG]}
tag=${2:-localhost/dpone-runtime:0.1.0}
engine=${DPONE_CONTAINER_ENGINE:-podman}
base=${DPONE_IMAGE_BASE:-localhost/dpone-base:bookworm-minbase}
extras=${DPONE_IMAGE_EXTRAS:-postgres}
if ! [[ "$extras" =~ ^[a-z]+(,[a-z]+)*$ ]]; then
  echo "build_image: DPONE_IMAGE_EXTRAS=$extras is not a comma-separated list of extras" >&2
  exit 2
fi
python=python3
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi

if [ -z "${DPONE_IMAGE_BASE:-}" ] && ! "$engine" image exists "$base"; then
  rootfs=.cache/image/rootfs
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    rm -rf "$rootfs"
    mkdir -p "$(dirname "$rootfs")"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >&2
  fi
  tar -C "$rootfs" --exclude='./var/cache/apt/archives/*.deb' -c . | "$engine" import - "$base" >&2
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
bash scripts/build.sh "$context/dist" 2>/dev/null
wheel=$(ls "$context"/dist/dpone_runtime-*.whl)
"$python" -m pip wheel --quiet --wheel-dir "$context/wheels" "$wheel[$extras]" >&2
# The image installs with the base's own python3, which need not be this host's: the wheelhouse
# also holds the binary wheels for every CPython the runtime supports (3.11 to 3.13) on this
# machine's architecture, so a base with another supported Python builds as well.
arch=$(uname -m)
for version in 3.11 3.12 3.13; do
  "$python" -m pip download --quiet --only-binary=:all: --python-version "$version" \
    --implementation cp --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
    --dest "$context/wheels" "$wheel[$extras]" >&2
done
cp -r "$catalog" "$context/catalog"
cp deploy/Containerfile "$context/Containerfile"
"$engine" build --quiet ${DPONE_BUILD_ISOLATION:+--isolation "$DPONE_BUILD_ISOLATION"} --build-arg "BASE=$base" --build-arg "EXTRAS=$extras" -t "$tag" -f "$context/Containerfile" "$context"
