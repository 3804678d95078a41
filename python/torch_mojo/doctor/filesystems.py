"""Which filesystem a path is on, and whether every node of a cluster
mounts that kind: the cache directory must be shared, MIOpen's databases
must not."""

from __future__ import annotations

import os

# Filesystems that every node of a cluster mounts.
SHARED_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "fuse.beegfs", "cifs", "ceph", "fuse.sshfs",
                      "wekafs", "fuse.dvs", "dvs", "panfs", "orangefs")


def filesystem_of(path: str) -> str:
    """The type of the filesystem `path` is on (the deepest mount above it)."""
    path, best, kind = os.path.realpath(path), "", "unknown"
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                mount_point = fields[1].replace("\\040", " ")
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, kind = mount_point, fields[2]
    except OSError:
        pass
    return kind
