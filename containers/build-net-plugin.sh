#!/bin/sh
# Builds RCCL's or NCCL's libfabric plugin (aws-ofi-nccl) into $3 for the
# image's GPUs: $1 is rocm or cuda, $2 the aws-ofi-nccl release (v1.19.0).
# The image's libfabric (Ubuntu's libfabric-dev) serves to build it; at run
# time the host's libfabric, with Slingshot's cxi provider, is bound over it
# (ABI 1.x: libfabric.so.1). Needs the network (GitHub, the distribution's
# packages) when the image is built.
set -eu
GPU=$1
RELEASE=$2
PREFIX=$3
apt-get update
apt-get install -y --no-install-recommends git autoconf automake libtool make libfabric-dev libhwloc-dev
git clone --depth 1 --branch "$RELEASE" https://github.com/aws/aws-ofi-nccl.git /tmp/aws-ofi-nccl
cd /tmp/aws-ofi-nccl
./autogen.sh
case "$GPU" in
  rocm) ./configure --prefix="$PREFIX" --with-libfabric=/usr --with-rocm=/opt/rocm --disable-tests ;;
  cuda) ./configure --prefix="$PREFIX" --with-libfabric=/usr --with-cuda=/usr/local/cuda --disable-tests ;;
  *) echo "build-net-plugin.sh: GPU must be rocm or cuda, not $GPU" >&2; exit 2 ;;
esac
make -j "$(nproc)"
make install
rm -rf /tmp/aws-ofi-nccl
