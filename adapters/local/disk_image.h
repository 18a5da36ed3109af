#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace sandbox {

// A sandbox's workspace quota: a sparse ext4 image (bytes = its size, inodes
// fixed at mkfs time) mounted through a loop device. Writes past it fail in
// the kernel with ENOSPC; the host disk grows by at most `bytes`.

// Creates the sparse image file with an empty ext4 filesystem whose root
// directory belongs to uid:gid (-1 = root).
absl::Status CreateDiskImage(const std::string& image, int64_t bytes, int64_t inodes, int uid);
// Mounts the image at `dir` (nosuid, nodev) on a loop device that is freed
// when it is unmounted. `new_image`: made since any mount (on no loop
// device), so syscalls alone can attach it (MountNewImage); otherwise
// mount(8), which reuses the loop device an image may still be on (a busy
// workspace unmounted lazily) rather than mount one filesystem twice.
absl::Status MountDiskImage(const std::string& image, const std::string& dir, bool new_image);
// Attaches `image`, which no loop device may have, to a free loop device
// (autoclear) and mounts it at `dir`, with syscalls alone: mount(8) reads the
// whole mount table and every loop device's sysfs entry. False when this way
// cannot (old kernel, no device node, a failed mount).
bool MountNewImage(const std::string& image, const std::string& dir);
// Whether something is mounted exactly at `dir`.
bool IsMountPoint(const std::string& dir);
// Unmounts `dir` if mounted (lazily when busy). Missing or unmounted is OK.
absl::Status UnmountDisk(const std::string& dir);

// The mount points strictly below `root` (resolved, as the mount table
// has them), from /proc/self/mountinfo. Empty when `root` cannot be
// resolved or is "/".
std::vector<std::string> MountsBelow(const std::string& root);

}  // namespace sandbox
