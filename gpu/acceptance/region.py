"""The shared region file's bytes (hami-common/src/layout.rs, versions 1 and 2), read directly
as a cross-check of `hami-agent inspect`: limits, used, slots, and who holds the region lock.

Pure functions of bytes; gpu/test_acceptance.py pins the offsets against layout.rs.
"""

import struct

# Usage kinds of every slot per layout version (version 2 added "pool" and "other").
REGION_MAGIC = b"HAMIRSv\x01"
REGION_HEADER_SIZE = 968
REGION_MAX_DEVICES = 16
REGION_MAX_SLOTS = 1024
REGION_USAGE_KINDS = {1: ("context", "module", "data"),
                      2: ("context", "module", "data", "pool", "other")}
_OFF_LIMITS = 136
_OFF_USED = 584


def region_slot_size(version):
    """Bytes of one slot: pid, status, start time, then [device][kind] u64 counters."""
    return 16 + REGION_MAX_DEVICES * len(REGION_USAGE_KINDS[version]) * 8


def read_region_bytes(data):
    """Decode a v1/v2 region file: {"limits", "used", "slots": [{"pid", "status", "usage"}]}."""
    if len(data) < REGION_HEADER_SIZE or data[:8] != REGION_MAGIC:
        raise ValueError("not a region (magic)")
    version, header_size, total_size = struct.unpack_from("<IIQ", data, 8)
    if version not in REGION_USAGE_KINDS or header_size != REGION_HEADER_SIZE:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    if len(data) < total_size:
        raise ValueError("region truncated")
    kinds = REGION_USAGE_KINDS[version]
    slot_size = region_slot_size(version)
    limits = list(struct.unpack_from("<16Q", data, _OFF_LIMITS))
    used = list(struct.unpack_from("<16Q", data, _OFF_USED))
    slots = []
    nslots = min(REGION_MAX_SLOTS, (total_size - header_size) // slot_size)
    for i in range(nslots):
        off = header_size + i * slot_size
        pid, status, _start = struct.unpack_from("<IIQ", data, off)
        if status == 0 and pid == 0:
            continue
        usage = struct.unpack_from(f"<{REGION_MAX_DEVICES * len(kinds)}Q", data, off + 16)
        dev0 = dict(zip(kinds, usage[:len(kinds)]))
        slots.append({"slot": i, "pid": pid, "status": status, "usage": dev0,
                      "total": sum(usage)})
    return {"limits": limits, "used": used, "slots": slots}


# The region lock, `RegionHeader::lock`: a process-shared, robust `pthread_mutex_t` after
# magic (8), version (4), header_size (4), total_size (8), init_state (4), device_count (4),
# creator_pid (4), _pad0 (4) and created_unix (8).
OFF_LOCK = 48
# glibc keeps a robust mutex's owner in its first 32-bit word (the futex word): the owner's
# thread id, with FUTEX_WAITERS and FUTEX_OWNER_DIED in the top two bits; 0 when free.
FUTEX_TID_MASK = 0x3FFFFFFF


def region_lock_owner(data):
    """Thread id of the region lock's holder according to the file's bytes (0: free).

    Raises ValueError for bytes that are not a region of a layout this module knows (the lock
    may sit elsewhere in another layout)."""
    if len(data) < REGION_HEADER_SIZE or data[:8] != REGION_MAGIC:
        raise ValueError("not a region (magic)")
    version, header_size = struct.unpack_from("<II", data, 8)
    if version not in REGION_USAGE_KINDS or header_size != REGION_HEADER_SIZE:
        raise ValueError(f"region version {version} header {header_size}: layout changed")
    (word,) = struct.unpack_from("<I", data, OFF_LOCK)
    return word & FUTEX_TID_MASK
