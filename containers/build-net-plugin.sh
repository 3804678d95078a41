#!/bin/sh
# Builds RCCL's or NCCL's libfabric plugin (aws-ofi-nccl) into $3 for the
# image's GPUs: $1 is rocm or cuda, $2 the aws-ofi-nccl release (v1.19.0),
# $4 the libfabric to build against (a prefix with include/ and lib64/ or
# lib/; default /usr, the image's own from Ubuntu's libfabric-dev).
#
# The plugin turns on what it finds in libfabric's headers (FI_MR_DMABUF,
# FI_OPT_MAX_MSG_SIZE, ...): built against the image's older libfabric,
# those are compiled out even where the host's newer libfabric, with
# Slingshot's cxi provider, is bound in at run time (ABI 1.x:
# libfabric.so.1). Give the host's prefix, bound in for the build, to keep
# them (the recipes' NET_PLUGIN_LIBFABRIC). AWS's platform code stays out
# (--disable-platform-aws): configure would turn it on by itself on an EC2
# build host, and it then needs libfabric 1.22 or newer. Needs the network
# (GitHub, the distribution's packages) when the image is built.
set -eu
GPU=$1
RELEASE=$2
PREFIX=$3
LIBFABRIC=${4:-/usr}
case "$GPU" in
  rocm) WITH_GPU="--with-rocm=/opt/rocm" ;;
  cuda) WITH_GPU="--with-cuda=/usr/local/cuda" ;;
  *) echo "build-net-plugin.sh: GPU must be rocm or cuda, not $GPU" >&2; exit 2 ;;
esac
if [ ! -e "$LIBFABRIC/include/rdma/fabric.h" ] && [ "$LIBFABRIC" != /usr ]; then
  echo "build-net-plugin.sh: $LIBFABRIC/include/rdma/fabric.h is missing: give a libfabric prefix (bind the host's in with apptainer build --bind)" >&2
  exit 2
fi
PACKAGES="git autoconf automake libtool make libhwloc-dev"
if [ "$LIBFABRIC" = /usr ]; then PACKAGES="$PACKAGES libfabric-dev"; fi
apt-get update
apt-get install -y --no-install-recommends $PACKAGES
git clone --depth 1 --branch "$RELEASE" https://github.com/aws/aws-ofi-nccl.git /tmp/aws-ofi-nccl
cd /tmp/aws-ofi-nccl
./autogen.sh
./configure --prefix="$PREFIX" --with-libfabric="$LIBFABRIC" "$WITH_GPU" --disable-platform-aws --disable-tests
make -j "$(nproc)"
make install
rm -rf /tmp/aws-ofi-nccl
